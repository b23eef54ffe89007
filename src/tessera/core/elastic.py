"""Elastic workloads (``SchedulerConfig.elastic``): which workers may be given back, growth into idle capacity, and
how a resize changes a workload's quota charge.

The scheduling step (``core.step``) calls these. A pending elastic workload (``PendingWorkload.elastic_min``) whose
gang does not fit starts with the most workers that fit, never fewer than its minimum. A running elastic workload
(``RunningWorkload.elastic_min`` / ``elastic_max``) may give back workers above its minimum (``Shrink``) before
anything is preempted whole: workers it grew above its gang to any pending workload of its queue, workers between
its minimum and its gang only to one of strictly higher priority, and (with a preemption policy that reclaims) any
above its minimum to a queue of its cohort that takes back nominal quota the shrinking workload's queue borrows.
A preemptible one (only those can give workers back) grows (``Grow``) into capacity that is idle once every pending
workload was tried and that its queue's quota admits (within nominal, or borrowed when the cohort allows it). No
loop: a shrink only ever serves a pending workload, taking growth back, a strictly higher priority, or a queue
taking back its own nominal quota (the no-loop order of ``core.preemption``), and a grow only takes capacity nobody
waits for, never in the step that shrank the workload.

Quota: a resize changes the charge by the workers' demand (``worker_charge``, what ``demand_of`` charges per worker).
A shrink gives back borrowed capacity first (``shrunk_admission``); a grow adds its own admission
(``grown_admission``). Pure: placements are tried on the live ``ClusterState`` through the ``bind`` callback, which
the step records and undoes before it returns.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence

import numpy as np

from tessera.core.decisions import Grow, RunningWorkload
from tessera.core.placement.base import Placer
from tessera.core.queueing.quotas import Admission
from tessera.core.queueing.resources import ResourceVector
from tessera.core.workload import Placement


def worker_charge(placement: Placement) -> ResourceVector:
    """What one worker is charged to its queue: its request's GPU milli, CPU and memory (as ``demand_of``)."""
    r = placement.request
    return ResourceVector(r.total_gpu_milli, r.cpu_milli, r.mem_mib)


def placements_charge(placements: Sequence[Placement]) -> ResourceVector:
    """GPU milli, CPU and memory that ``placements`` hold (a workload's charge is that of its workers)."""
    return sum((worker_charge(p) for p in placements), ResourceVector.zero())


def shrunk_admission(admission: Admission, charge: ResourceVector) -> tuple[Admission, Admission]:
    """``(kept, given back)`` when workers charged ``charge`` leave: the borrowed part goes first."""
    from_borrowed = charge.minimum(admission.borrowed)
    from_nominal = charge - from_borrowed
    kept = Admission(
        admission.queue, admission.flavor_key, admission.from_nominal - from_nominal, admission.borrowed - from_borrowed
    )
    return kept, Admission(admission.queue, admission.flavor_key, from_nominal, from_borrowed)


def grown_admission(admission: Admission, added: Admission) -> Admission:
    """The admission of a workload after a grow admitted as ``added``."""
    return Admission(
        admission.queue,
        admission.flavor_key,
        admission.from_nominal + added.from_nominal,
        admission.borrowed + added.borrowed,
    )


def shrinkable_workers(
    running: Collection[RunningWorkload],
    priority: int,
    queue: str | None = None,
    reclaim_from: Collection[str] = (),
) -> list[tuple[str, Placement]]:
    """``(workload id, worker)`` pairs that may be given back to a pending workload of ``priority`` (of ``queue``;
    None: any queue, the implicit one), from preemptible elastic workloads, never below their minimum: first those
    of the queues in ``reclaim_from`` (other queues that borrow the pending workload's nominal quota; any priority),
    then workers of ``queue``'s workloads grown above their gang (``RunningWorkload.gang``; any priority: growth only
    ever took capacity nobody waited for), then workers above the minimum of ``queue``'s workloads of strictly lower
    priority. Within each, lowest priority first, then the youngest workload, each workload's last worker first."""

    def shrinkable(r: RunningWorkload) -> bool:
        return r.elastic_min is not None and r.preemptible and len(r.placements) > r.elastic_min

    def ordered(group: list[RunningWorkload]) -> list[RunningWorkload]:
        return sorted(group, key=lambda r: (r.priority, -r.started_s, r.workload_id))

    own = [r for r in running if (queue is None or r.queue == queue) and shrinkable(r)]
    reclaim = [r for r in running if r.queue in reclaim_from and r.queue != queue and shrinkable(r)]
    pairs: list[tuple[str, Placement]] = []
    for r in ordered(reclaim):
        assert r.elastic_min is not None
        pairs.extend((r.workload_id, p) for p in reversed(r.placements[r.elastic_min :]))
    pairs.extend(grown_workers(own))
    gang = {r.workload_id: _gang(r) for r in own}
    for r in ordered([r for r in own if r.priority < priority]):
        assert r.elastic_min is not None
        pairs.extend((r.workload_id, p) for p in reversed(r.placements[r.elastic_min : gang[r.workload_id]]))
    return pairs


def _gang(r: RunningWorkload) -> int:
    """The workers ``r`` asked for (never below its minimum); workers above it were grown."""
    return max(r.elastic_min or 0, r.gang or len(r.placements))


def grown_workers(running: Collection[RunningWorkload]) -> list[tuple[str, Placement]]:
    """``(workload id, worker)`` pairs of the workers preemptible elastic ``running`` workloads grew above their
    gang: capacity nobody waited for when they took it, which any pending workload of their queue may use. Lowest
    priority first, then the youngest workload, each workload's last worker first."""
    grown = [r for r in running if r.elastic_min is not None and r.preemptible and len(r.placements) > _gang(r)]
    grown.sort(key=lambda r: (r.priority, -r.started_s, r.workload_id))
    return [(r.workload_id, p) for r in grown for p in reversed(r.placements[_gang(r) :])]


def grow_into_idle(
    placer: Placer,
    rng: np.random.Generator,
    running: Sequence[RunningWorkload],
    bind: Callable[[RunningWorkload, Placement], None],
    admits: Callable[[RunningWorkload], bool] = lambda r: True,
) -> list[Grow]:
    """Add workers to preemptible elastic ``running`` workloads (growth must be given back when others need it) below
    their ``elastic_max``, one worker per workload per round
    (highest priority, then oldest, first) until none can grow; each worker prefers the nodes its workload uses and
    goes only onto the GPU model its first worker runs on (a gang of mixed models runs at its slowest one's pace).
    ``admits(r)``: whether the quota admits one more worker of ``r`` now (``bind`` then charges it)."""
    growable = [
        r
        for r in running
        if r.elastic_max is not None and r.preemptible and r.placements and len(r.placements) < r.elastic_max
    ]
    growable.sort(key=lambda r: (-r.priority, r.started_s, r.workload_id))
    added: dict[str, list[Placement]] = {r.workload_id: [] for r in growable}
    while growable:
        still = []
        for r in growable:
            if not admits(r):
                continue
            workers = list(r.placements) + added[r.workload_id]
            request = r.placements[0].request
            used = np.unique(np.array([p.node for p in workers], dtype=np.int64))
            state = placer.state
            same_model = np.flatnonzero(state.model_idx == state.model_idx[r.placements[0].node])
            placement = placer.decide(request, rng, among=used) or placer.decide(request, rng, among=same_model)
            if placement is None:
                continue
            bind(r, placement)
            added[r.workload_id].append(placement)
            assert r.elastic_max is not None
            if len(workers) + 1 < r.elastic_max:
                still.append(r)
        growable = still
    return [Grow(workload_id, tuple(placed)) for workload_id, placed in added.items() if placed]
