"""Checks every scheduling step can run: nothing over-allocated, totals conserved, every placement accounted for.

Tests call ``check_cluster`` after every placement and the simulator does so in debug mode. Violations raise
``InvariantViolation`` (an internal error: a bug in Tessera, never bad user input).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from tessera.core.cluster import ClusterState
from tessera.core.workload import MILLI_PER_GPU, Placement


class InvariantViolation(AssertionError):
    """The cluster state contradicts itself or the placements made on it."""


def check_cluster(state: ClusterState, placements: Iterable[Placement] | None = None) -> None:
    """Raise ``InvariantViolation`` if ``state`` is inconsistent (with ``placements``, when given)."""
    _check_bounds(state)
    if placements is not None:
        _check_conservation(state, list(placements))


def _check_bounds(state: ClusterState) -> None:
    if (state.gpu_free_milli < 0).any() or (state.gpu_free_milli > state.gpu_cap_milli).any():
        raise InvariantViolation("a GPU's free share is outside [0, capacity]")
    if (state.gpu_free_milli[~state.gpu_exists] != 0).any():
        raise InvariantViolation("a padding GPU slot has free capacity")
    if (state.cpu_free_milli < 0).any() or (state.cpu_free_milli > state.cpu_cap_milli).any():
        raise InvariantViolation("a node's free CPU is outside [0, capacity]")
    if (state.mem_free_mib < 0).any() or (state.mem_free_mib > state.mem_cap_mib).any():
        raise InvariantViolation("a node's free memory is outside [0, capacity]")
    if (state.gpu_cap_milli[state.gpu_exists] != MILLI_PER_GPU).any():
        raise InvariantViolation("a GPU's capacity is not one whole GPU")


def _check_conservation(state: ClusterState, placements: list[Placement]) -> None:
    used_gpu = np.zeros_like(state.gpu_free_milli)
    used_cpu = np.zeros_like(state.cpu_free_milli)
    used_mem = np.zeros_like(state.mem_free_mib)
    for p in placements:
        if len(p.gpu_indices) != p.request.num_gpus:
            raise InvariantViolation(
                f"placement on node {p.node} holds {len(p.gpu_indices)} GPUs, not {p.request.num_gpus}"
            )
        if p.request.gpu_types and p.request.num_gpus and state.nodes[p.node].gpu_model not in p.request.gpu_types:
            raise InvariantViolation(f"placement on node {p.node} violates the request's GPU types")
        for gpu in p.gpu_indices:
            used_gpu[p.node, gpu] += p.gpu_milli_each
        used_cpu[p.node] += p.request.cpu_milli
        used_mem[p.node] += p.request.mem_mib
    if not np.array_equal(state.gpu_cap_milli - state.gpu_free_milli, used_gpu):
        raise InvariantViolation("allocated GPU shares differ from the sum of placements")
    if not np.array_equal(state.cpu_cap_milli - state.cpu_free_milli, used_cpu):
        raise InvariantViolation("allocated CPU differs from the sum of placements")
    if not np.array_equal(state.mem_cap_mib - state.mem_free_mib, used_mem):
        raise InvariantViolation("allocated memory differs from the sum of placements")
