"""Gang placement: all workers of a gang or none, on as few nodes as possible.

A gang (``PendingWorkload.gang`` workers of one request) prefers one node (``SchedulerConfig.gang_one_node``):
``one_node_candidates`` lists the nodes that can hold every worker at once (CPU, memory and GPU slots: whole free
GPUs for whole-GPU workers, shares that fit for fractional ones); among those of the GPU model the placement policy
prefers for the gang's first worker, the policy picks the best node and the other workers follow it there. When no
such node exists, workers spread, each preferring a node the gang already uses (so they land on as few nodes as the
free capacity allows). Called by the scheduling step (``core.step``), which binds each worker on the state as it
goes; pure apart from that state.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from tessera.core.cluster import ClusterState, IntArray
from tessera.core.placement.base import Placer
from tessera.core.workload import MILLI_PER_GPU, Placement, Request


def one_node_candidates(state: ClusterState, request: Request, workers: int) -> IntArray:
    """Indices of the nodes that can host ``workers`` copies of ``request`` together, now."""
    ok = (state.cpu_free_milli >= workers * request.cpu_milli) & (state.mem_free_mib >= workers * request.mem_mib)
    if request.num_gpus > 0:
        need = state.milli_by_model(request)[state.model_idx]
        ok &= state.allowed_models(request)[state.model_idx] & (need <= MILLI_PER_GPU)
        ok &= gpu_worker_slots(state.gpu_free_milli, need[:, None], request.num_gpus) >= workers
    return np.flatnonzero(ok)


def gpu_worker_slots(free: IntArray, need: IntArray | int, num_gpus: int) -> IntArray:
    """How many workers, each taking ``num_gpus`` GPUs of ``need`` milli, fit in the per-GPU free capacity ``free``
    (GPUs on the last axis): shares pack onto any GPU, whole GPUs need GPUs with nothing taken."""
    if num_gpus == 1:
        return np.asarray((free // np.maximum(need, 1)).sum(axis=-1), dtype=np.int64)
    return np.asarray((free == MILLI_PER_GPU).sum(axis=-1) // num_gpus, dtype=np.int64)


def place_gang(
    placer: Placer,
    request: Request,
    workers: int,
    rng: np.random.Generator,
    bind: Callable[[Placement], None],
    one_node: bool = True,
) -> list[Placement] | None:
    """Place ``workers`` copies of ``request``, calling ``bind`` on each placement as it is made; None (with the
    placements made so far left to the caller to undo) when some worker does not fit. With ``one_node`` the gang
    goes onto one node of the GPU model the policy would choose for its first worker, when one can hold it all;
    otherwise (or without ``one_node``) each worker prefers the nodes the gang already uses."""
    placed: list[Placement] = []
    together = _together(placer, request, workers, rng) if one_node and workers > 1 else None
    for _ in range(workers):
        used = np.unique(np.array([p.node for p in placed], dtype=np.int64)) if placed else None
        decision = None
        if together is not None and together.size:
            decision = placer.decide(request, rng, among=together if used is None else used)
        elif used is not None:
            decision = placer.decide(request, rng, among=used)
        if decision is None:
            decision = placer.decide(request, rng)
        if decision is None:
            return None
        bind(decision)
        placed.append(decision)
    return placed


def _together(placer: Placer, request: Request, workers: int, rng: np.random.Generator) -> IntArray | None:
    """The nodes of the policy's preferred GPU model that can hold the whole gang (the policy's choice of model,
    e.g. the fastest for the job type, comes first; packing the gang comes second)."""
    first = placer.decide(request, rng)
    if first is None:
        return None
    state = placer.state
    nodes = one_node_candidates(state, request, workers)
    same_model: IntArray = nodes[state.model_idx[nodes] == state.model_idx[first.node]]
    return same_model
