"""How long queues of the timeline simulator wait for borrowed capacity: the "reclaim within one step" measure.

After the scheduling steps of each instant the replay asks, for every queue, whether one of its pending workloads
(the head of each request shape) is *blocked by borrowers*: it fits within its queue's unused nominal quota but
cannot be admitted because other queues borrow that quota (``Scheduler.blocked_by_borrowers``). Two stretches are
timed per queue, from the instant such a workload is seen to the instant none is:

- ``quota_blocked``: blocked by borrowers, whatever else stands in its way;
- ``reclaim_missed``: blocked by borrowers *and* a step planning that workload alone would bind it now if every
  workload of the other queues could be preempted (``Scheduler.reclaim_would_admit`` on a copy of the running set
  where they are marked preemptible, so that a borrower the policy cannot preempt still counts against it): giving
  back the borrowed capacity would let it run, yet the instant's steps did not. This is the latency of "borrowed
  capacity is returned within one scheduling step of the owner's demand": 0 when every reclaim that lets the owner
  run happens in the step where its demand appears.

The two differ when returning the borrowed capacity would not let the workload run (e.g. a gang of whole GPUs while
the free capacity and the borrowers' shares are fractions of GPUs shared with work the rule protects). Used by
``tessera.sim.replay.timeline``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np

from tessera.core.scheduler import PendingWorkload, RunningWorkload, Scheduler


class ReclaimTracker:
    def __init__(self, scheduler: Scheduler, seed: int) -> None:
        self.scheduler = scheduler
        self.rng = np.random.default_rng(seed)  # for the probing steps only: the replay's own stream is untouched
        self.since: dict[str, dict[str, float]] = {"quota_blocked": {}, "reclaim_missed": {}}
        self.longest: dict[str, float] = {"quota_blocked": 0.0, "reclaim_missed": 0.0}

    def track(
        self,
        now_s: float,
        heads: Sequence[PendingWorkload],
        running: Callable[[], Sequence[RunningWorkload]],
    ) -> None:
        """Start or end each queue's stretches (module docstring) after the steps of instant ``now_s``."""
        quota = {h.workload_id for h in heads if self.scheduler.blocked_by_borrowers(h)}
        blocked = {h.queue for h in heads if h.workload_id in quota}
        missed: set[str] = set()
        if quota:
            live = running()
            for head in heads:
                if head.workload_id in quota and head.queue not in missed and self._would_run(head, live, now_s):
                    missed.add(head.queue)
        self._update("quota_blocked", blocked, now_s)
        self._update("reclaim_missed", missed, now_s)

    def _would_run(self, head: PendingWorkload, live: Sequence[RunningWorkload], now_s: float) -> bool:
        """Whether ``head`` would be bound if every other queue's workload could be preempted."""
        probe = [r if r.queue == head.queue else dataclasses.replace(r, preemptible=True) for r in live]
        return self.scheduler.reclaim_would_admit(head, self.rng, probe, now_s)

    def _update(self, kind: str, queues: set[str], now_s: float) -> None:
        since = self.since[kind]
        for queue in queues:
            since.setdefault(queue, now_s)
        for queue in [q for q in since if q not in queues]:
            self.longest[kind] = max(self.longest[kind], now_s - since.pop(queue))
