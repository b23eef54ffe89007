"""Head reservation (EASY backfill) for BestEffortFIFO queues: the first workload of a queue that cannot be placed
gets a reservation, and later workloads of that queue start only where they do not delay it.

``find_reservation`` walks the running workloads whose expected end is known, earliest end first, releasing their
placements on the live state until the head fits: that time is the head's *shadow time*, and the capacity it would
use then is reserved. Everything it released is bound again before it returns. Running workloads without an expected
end are assumed to run forever; when the head does not fit even after every known end, there is no reservation (and
the queue backfills as before).

A reservation keeps, per node the head would use, the *slack*: what may be taken now without hurting the head at its
shadow time (free at the shadow time minus what the head takes there). ``mask`` hides the rest of those nodes' free
capacity from the placer while a backfill candidate is tried; ``unmask`` gives it back; ``consume`` charges a
backfilled workload's placements to the slack. Pure: no clock, no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np

from tessera.core.cluster import ClusterState, IntArray
from tessera.core.decisions import RunningWorkload
from tessera.core.workload import Placement, Request


@dataclass(slots=True)
class Reservation:
    head_id: str
    shadow_s: float  # when the head is expected to fit
    nodes: list[int]  # nodes the head would use then
    gpu_slack: IntArray  # per reserved node, per GPU: milli that may be taken now
    cpu_slack: IntArray
    mem_slack: IntArray
    _masked: list[tuple[IntArray, IntArray, IntArray]] = field(default_factory=list)

    def mask(self, state: ClusterState) -> None:
        """Hide, on the reserved nodes, the free capacity beyond the slack (until ``unmask``)."""
        nodes = np.array(self.nodes, dtype=np.int64)
        gpu = np.maximum(state.gpu_free_milli[nodes] - self.gpu_slack, 0)
        cpu = np.maximum(state.cpu_free_milli[nodes] - self.cpu_slack, 0)
        mem = np.maximum(state.mem_free_mib[nodes] - self.mem_slack, 0)
        state.gpu_free_milli[nodes] -= gpu
        state.cpu_free_milli[nodes] -= cpu
        state.mem_free_mib[nodes] -= mem
        state.version[nodes] += 1
        self._masked.append((gpu, cpu, mem))

    def unmask(self, state: ClusterState) -> None:
        nodes = np.array(self.nodes, dtype=np.int64)
        gpu, cpu, mem = self._masked.pop()
        state.gpu_free_milli[nodes] += gpu
        state.cpu_free_milli[nodes] += cpu
        state.mem_free_mib[nodes] += mem
        state.version[nodes] += 1

    def consume(self, placements: Iterable[Placement]) -> None:
        """Charge a backfilled workload's placements (made within the mask) to the slack."""
        row = {n: k for k, n in enumerate(self.nodes)}
        for p in placements:
            k = row.get(p.node)
            if k is None:
                continue
            self.cpu_slack[k] -= p.request.cpu_milli
            self.mem_slack[k] -= p.request.mem_mib
            if p.gpu_indices:
                self.gpu_slack[k, list(p.gpu_indices)] -= p.gpu_milli_each


def find_reservation(
    state: ClusterState,
    head_id: str,
    request: Request,
    gang: int,
    running: Iterable[RunningWorkload],
    now_s: float,
    place: Callable[[], list[Placement] | None],
) -> Reservation | None:
    """The head's reservation (module docstring), or None when no known end lets it fit. ``place`` places the head
    on the state as it is and undoes its placements, returning them (None when it does not fit)."""
    ending = sorted(
        (r for r in running if r.expected_end_s is not None), key=lambda r: (r.expected_end_s, r.workload_id)
    )
    if not ending:
        return None
    allowed = state.allowed_models(request)[state.model_idx]
    free_gpu = int(state.gpu_free_milli[allowed].sum())
    free_cpu = int(state.cpu_free_milli[allowed].sum())
    need_gpu = request.total_gpu_milli * gang
    need_cpu = request.cpu_milli * gang
    released: list[Placement] = []
    found: Reservation | None = None
    try:
        for k, r in enumerate(ending):
            for p in r.placements:
                state.release(p)
                released.append(p)
                if allowed[p.node]:
                    free_gpu += p.total_gpu_milli
                    free_cpu += p.request.cpu_milli
            end = float(r.expected_end_s or 0.0)
            if k + 1 < len(ending) and ending[k + 1].expected_end_s == end:
                continue  # release every workload ending at this instant first
            if free_gpu < need_gpu or free_cpu < need_cpu:
                continue
            placements = place()
            if placements is None:
                continue
            found = _reserve(state, head_id, max(end, now_s), placements)
            break
    finally:
        for p in reversed(released):
            state.bind(p)
    return found


def _reserve(state: ClusterState, head_id: str, shadow_s: float, placements: list[Placement]) -> Reservation:
    """The slack on the head's nodes, with the state as it is at the shadow time (head not placed)."""
    nodes = sorted({p.node for p in placements})
    row = {n: k for k, n in enumerate(nodes)}
    index = np.array(nodes, dtype=np.int64)
    gpu = state.gpu_free_milli[index].copy()
    cpu = state.cpu_free_milli[index].copy()
    mem = state.mem_free_mib[index].copy()
    for p in placements:
        k = row[p.node]
        cpu[k] -= p.request.cpu_milli
        mem[k] -= p.request.mem_mib
        if p.gpu_indices:
            gpu[k, list(p.gpu_indices)] -= p.gpu_milli_each
    return Reservation(head_id, shadow_s, nodes, gpu, cpu, mem)
