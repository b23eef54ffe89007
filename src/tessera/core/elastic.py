"""Elastic workloads (``SchedulerConfig.elastic``): which workers may be given back, and growth into idle capacity.

The scheduling step (``core.step``) calls these. A pending elastic workload (``PendingWorkload.elastic_min``) whose
gang does not fit starts with the most workers that fit, never fewer than its minimum. A running elastic workload
(``RunningWorkload.elastic_min`` / ``elastic_max``) may give back workers above its minimum (``Shrink``) to a pending
workload of strictly higher priority before anything is preempted whole, and grows (``Grow``) into capacity that
is idle after every pending workload was placed. No loop: a shrink only ever serves a strictly higher priority (an
acyclic order), and a grow only takes capacity nobody waits for, so it cannot delay a pending workload.

Pure: placements are tried on the live ``ClusterState`` through the ``bind`` callback, which the step records and
undoes before it returns.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence

import numpy as np

from tessera.core.decisions import Grow, RunningWorkload
from tessera.core.placement.base import Placer
from tessera.core.workload import Placement


def shrinkable_workers(running: Collection[RunningWorkload], priority: int) -> list[tuple[str, Placement]]:
    """``(workload id, worker)`` pairs that may be given back to a pending workload of ``priority``: workers above
    the minimum of preemptible elastic workloads of strictly lower priority; lowest priority first, then the
    youngest workload, each workload's last worker first."""
    eligible = [
        r
        for r in running
        if r.elastic_min is not None and r.preemptible and r.priority < priority and len(r.placements) > r.elastic_min
    ]
    eligible.sort(key=lambda r: (r.priority, -r.started_s, r.workload_id))
    pairs: list[tuple[str, Placement]] = []
    for r in eligible:
        assert r.elastic_min is not None
        extra = r.placements[r.elastic_min :]
        pairs.extend((r.workload_id, p) for p in reversed(extra))
    return pairs


def grow_into_idle(
    placer: Placer,
    rng: np.random.Generator,
    running: Sequence[RunningWorkload],
    bind: Callable[[Placement], None],
) -> list[Grow]:
    """Add workers to elastic ``running`` workloads below their ``elastic_max``, one worker per workload per round
    (highest priority, then oldest, first) until none can grow; each worker prefers the nodes its workload uses."""
    growable = [r for r in running if r.elastic_max is not None and r.placements and len(r.placements) < r.elastic_max]
    growable.sort(key=lambda r: (-r.priority, r.started_s, r.workload_id))
    added: dict[str, list[Placement]] = {r.workload_id: [] for r in growable}
    while growable:
        still = []
        for r in growable:
            workers = list(r.placements) + added[r.workload_id]
            request = r.placements[0].request
            used = np.unique(np.array([p.node for p in workers], dtype=np.int64))
            placement = placer.decide(request, rng, among=used) or placer.decide(request, rng)
            if placement is None:
                continue
            bind(placement)
            added[r.workload_id].append(placement)
            assert r.elastic_max is not None
            if len(workers) + 1 < r.elastic_max:
                still.append(r)
        growable = still
    return [Grow(workload_id, tuple(placed)) for workload_id, placed in added.items() if placed]
