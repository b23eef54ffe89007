"""Checks every scheduling step can run: nothing over-allocated, totals conserved, every placement accounted for.

Tests call ``check_cluster`` after every placement, and the timeline simulator calls it and ``check_quotas`` after
every step in debug mode (``run_timeline(..., check_invariants=True)``). Violations raise
``InvariantViolation`` (an internal error: a bug in Tessera, never bad user input).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from tessera.core.cluster import ClusterState
from tessera.core.decisions import RunningWorkload
from tessera.core.elastic import placements_charge
from tessera.core.queueing.quotas import QuotaLedger
from tessera.core.queueing.resources import Flavor, ResourceVector
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
    if (state.bound < 0).any():
        raise InvariantViolation("a node holds a negative number of placements")
    gone = state.gone
    if (gone & ~state.drained).any() or state.bound[gone].any() or state.gpu_exists[gone].any():
        raise InvariantViolation("a removed node is schedulable, holds placements or has GPUs")
    if state.cpu_cap_milli[gone].any() or state.mem_cap_mib[gone].any():
        raise InvariantViolation("a removed node has CPU or memory")


def _check_conservation(state: ClusterState, placements: list[Placement]) -> None:
    used_gpu = np.zeros_like(state.gpu_free_milli)
    used_cpu = np.zeros_like(state.cpu_free_milli)
    used_mem = np.zeros_like(state.mem_free_mib)
    count = np.zeros_like(state.bound)
    for p in placements:
        count[p.node] += 1
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
    if not np.array_equal(state.bound, count):
        raise InvariantViolation("the placements bound per node differ from the placements given")


def check_quotas(ledger: QuotaLedger) -> None:
    """Raise ``InvariantViolation`` if a queue holds more than ``nominal + borrowing_limit`` (``nominal`` without a
    cohort) or a cohort's pool lends more than its members may lend (sum of ``min(N - u, lending_limit)`` < 0)."""
    pools: dict[tuple[str, Flavor], ResourceVector] = {}
    for spec in ledger.queues:
        for key, nominal in spec.nominal.items():
            used = ledger.usage(spec.name, key)
            if spec.cohort is None:
                if not used <= nominal:
                    raise InvariantViolation(f"queue {spec.name} holds {used} of {key}, above its nominal {nominal}")
                continue
            borrow = (spec.borrowing_limit or {}).get(key)
            if borrow is not None and not used <= nominal + borrow:
                raise InvariantViolation(f"queue {spec.name} holds {used} of {key}, above nominal + borrowing limit")
            slack = nominal - used
            lend = (spec.lending_limit or {}).get(key)
            if lend is not None:
                slack = slack.minimum(lend)
            pools[(spec.cohort, key)] = pools.get((spec.cohort, key), ResourceVector.zero()) + slack
    for (cohort, key), slack in pools.items():
        if not slack.is_non_negative():
            raise InvariantViolation(f"cohort {cohort} lends more {key} than its queues may lend ({slack})")


def check_charges(ledger: QuotaLedger, running: Sequence[RunningWorkload]) -> None:
    """Raise ``InvariantViolation`` unless every running workload's admission charges exactly its workers and the
    ledger holds exactly the running workloads' charges (a resize that forgot its quota change breaks both)."""
    held: dict[tuple[str, str], ResourceVector] = {}
    for r in running:
        if r.admission.charged != placements_charge(r.placements):
            raise InvariantViolation(f"workload {r.workload_id} is charged {r.admission.charged} for other workers")
        pool = (r.queue, r.admission.flavor_key)
        held[pool] = held.get(pool, ResourceVector.zero()) + r.admission.charged
    for spec in ledger.queues:
        for key in spec.nominal:
            if ledger.usage(spec.name, key) != held.get((spec.name, key), ResourceVector.zero()):
                raise InvariantViolation(f"queue {spec.name} holds {ledger.usage(spec.name, key)} of {key}")
