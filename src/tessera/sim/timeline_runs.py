"""When the replay's running jobs end: their progress, co-location partners and departures (``RunClock``).

The replay asks the clock when a job it starts will end (``begin``), tells it when a job stops (``end``) or is
preempted with a checkpoint (``suspend``: the share of the work still to do is kept, to resume at the speed of
whatever GPU model it restarts on), and hands it resized jobs (``retime``). A job's speed is its ``Progress``
(``sim/timeline_progress.py``); with a co-location model, typed jobs on part of one GPU slow each other
(``sim/colocation.py``) and a join or a leave re-times the jobs left on that GPU.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING

from tessera.core.throughput import ColocationModel
from tessera.core.workload import MILLI_PER_GPU, Placement
from tessera.sim.colocation import SharedGpus
from tessera.sim.timeline_progress import Progress

if TYPE_CHECKING:
    from tessera.sim.timeline import _Replay


class RunClock:
    """Progress, remaining work of suspended jobs, and GPU sharing of one replay."""

    def __init__(self, replay: _Replay, colocation: ColocationModel | None) -> None:
        self.replay = replay
        self.progress: dict[int, Progress] = {}  # running jobs: how far they got, how fast they run
        self.remaining: dict[int, float] = {}  # checkpointed, preempted jobs: share of the work still to do
        self.shared = SharedGpus(colocation) if colocation is not None else None  # every policy alike

    def duration(self, i: int, placements: tuple[Placement, ...]) -> float:
        """The whole job's runtime with its whole gang at isolated speed on the GPU model of ``placements``."""
        job = self.replay.jobs[i]
        if job.duration_s is not None:
            return float(job.duration_s)
        model = self.replay.state.nodes[placements[0].node].gpu_model or ""
        return float(job.work_steps or 0.0) / self.replay.throughput.throughput(job.job_type or "", model)

    def known_duration(self, i: int) -> float | None:
        """How long a pending job will run once started, when that does not depend on where it runs."""
        duration = self.replay.jobs[i].duration_s
        return None if duration is None else float(duration) * self.remaining.get(i, 1.0)

    def begin(self, now: float, i: int, placements: tuple[Placement, ...]) -> tuple[float, list[int]]:
        """Job ``i`` starts on ``placements``: when it ends at its current speed (infinity while it waits on its GPU
        for a partner that cannot run beside it), and the partners whose speed its arrival changed (re-time them
        with ``retime_partners`` once the replay has recorded the start)."""
        full_s = self.duration(i, placements) * self.remaining.pop(i, 1.0)
        partners = self._join_shared(i, placements)
        factor = self.shared.factor(i) if self.shared is not None else 1.0
        progress = Progress(full_s, now, len(placements), self.replay.jobs[i].gang, factor)
        self.progress[i] = progress
        return progress.end_s, partners

    def suspend(self, now: float, i: int) -> None:
        """A checkpointed job is preempted: keep the share of its work still to do."""
        full_s = self.duration(i, self.replay.placements[i])
        self.remaining[i] = self.progress[i].left_at(now) / full_s if full_s > 0 else 0.0

    def end(self, now: float, i: int) -> None:
        """Job ``i`` stopped (finished or preempted): forget its progress; its GPU partners speed up."""
        self.progress.pop(i, None)
        if self.shared is not None:
            self.retime_partners(now, self.shared.leave(i))

    def retime(self, now: float, i: int, progress: Progress) -> None:
        """Running job ``i`` goes on at ``progress`` from ``now``: reschedule its departure (the old one, and its
        rechecks, become stale with a new run token) and its LAS rechecks."""
        replay = self.replay
        self.progress[i] = progress
        end = progress.end_s
        replay.tokens[i] += 1
        replay.finish_s[i] = end
        if end < math.inf:
            replay.loop.schedule(end, ("depart", i, replay.tokens[i]), priority=0)
        running = replay.running.get(i)  # only policies that run the quota-aware step keep running entries
        if running is not None:
            replay.running[i] = dataclasses.replace(running, expected_end_s=end)
            guard_left = running.started_s + replay.guard.min_runtime_s - now
            replay.schedule_rechecks(now, i, end - now, guard_left if guard_left > 0 else None)

    def retime_partners(self, now: float, partners: list[int]) -> None:
        """The jobs whose GPU partners changed run at their new co-location factor from ``now``."""
        for j in partners:
            if j in self.progress and self.shared is not None:
                self.retime(now, j, self.progress[j].changed(now, factor=self.shared.factor(j)))

    def _join_shared(self, i: int, placements: tuple[Placement, ...]) -> list[int]:
        """Co-location: a typed single-worker job on part of a GPU joins that GPU's sharers; returns the partners
        whose speed this changed."""
        job = self.replay.jobs[i]
        if self.shared is None or not job.job_type or len(placements) != 1:
            return []
        placement = placements[0]
        if placement.gpu_milli_each >= MILLI_PER_GPU or len(placement.gpu_indices) != 1:
            return []
        model = self.replay.state.nodes[placement.node].gpu_model or ""
        joined = self.shared.join(i, job.job_type, (placement.node, placement.gpu_indices[0]), model)
        return [j for j in joined if j != i]
