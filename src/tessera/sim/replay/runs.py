"""When the replay's running jobs end: their progress, co-location partners and departures (``RunClock``).

The replay asks the clock when a job it starts will end (``begin``), tells it when a job stops (``end``) or is
preempted with a checkpoint (``suspend``: the share of the work still to do is kept, to resume at the speed of
whatever GPU model it restarts on), and hands it resized jobs (``retime``). A job's speed is its ``Progress``
(``sim/replay/progress.py``); with a co-location model, typed jobs on part of one GPU slow each other
(``sim/replay/colocation.py``) and a join or a leave re-times the jobs left on that GPU. Whenever a running job's
end moves, the clock calls the replay's ``on_retime(now_s, job, end_s)`` (which reschedules its departure): physics
only, no scheduling books.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from tessera.core.cluster import ClusterState
from tessera.core.throughput import ColocationModel, ThroughputModel
from tessera.core.workload import MILLI_PER_GPU, Placement
from tessera.sim.replay.colocation import SharedGpus
from tessera.sim.replay.progress import Progress
from tessera.sim.replay.result import TimelineJobLike


class RunClock:
    """Progress, remaining work of suspended jobs, and GPU sharing of one replay."""

    def __init__(
        self,
        jobs: Sequence[TimelineJobLike],
        state: ClusterState,
        throughput: ThroughputModel,
        colocation: ColocationModel | None,
        on_retime: Callable[[float, int, float], None],
    ) -> None:
        self.jobs = jobs
        self.state = state
        self.throughput = throughput
        self.on_retime = on_retime
        self.progress: dict[int, Progress] = {}  # running jobs: how far they got, how fast they run
        self.remaining: dict[int, float] = {}  # checkpointed, preempted jobs: share of the work still to do
        self.shared = SharedGpus(colocation) if colocation is not None else None  # every policy alike

    def duration(self, i: int, placements: tuple[Placement, ...]) -> float:
        """The whole job's runtime with its whole gang at isolated speed on the GPU model of ``placements``."""
        job = self.jobs[i]
        if job.duration_s is not None:
            return float(job.duration_s)
        model = self.state.nodes[placements[0].node].gpu_model or ""
        return float(job.work_steps or 0.0) / self.throughput.throughput(job.job_type or "", model)

    def known_duration(self, i: int) -> float | None:
        """How long a pending job will run once started, when that does not depend on where it runs."""
        duration = self.jobs[i].duration_s
        return None if duration is None else float(duration) * self.remaining.get(i, 1.0)

    def begin(self, now: float, i: int, placements: tuple[Placement, ...]) -> tuple[float, list[int]]:
        """Job ``i`` starts on ``placements``: when it ends at its current speed (infinity while it waits on its GPU
        for a partner that cannot run beside it), and the partners whose speed its arrival changed (re-time them
        with ``retime_partners`` once the replay has recorded the start)."""
        full_s = self.duration(i, placements) * self.remaining.pop(i, 1.0)
        partners = self._join_shared(i, placements)
        factor = self.shared.factor(i) if self.shared is not None else 1.0
        progress = Progress(full_s, now, len(placements), self.jobs[i].gang, factor)
        self.progress[i] = progress
        return progress.end_s, partners

    def suspend(self, now: float, i: int, placements: tuple[Placement, ...]) -> None:
        """A checkpointed job preempted off ``placements``: keep the share of its work still to do."""
        full_s = self.duration(i, placements)
        self.remaining[i] = self.progress[i].left_at(now) / full_s if full_s > 0 else 0.0

    def end(self, now: float, i: int) -> None:
        """Job ``i`` stopped (finished or preempted): forget its progress; its GPU partners speed up."""
        self.progress.pop(i, None)
        if self.shared is not None:
            self.retime_partners(now, self.shared.leave(i))

    def resized(self, now: float, i: int, workers: int) -> None:
        """Running job ``i`` goes on with ``workers`` workers from ``now``."""
        self.retime(now, i, self.progress[i].changed(now, workers=workers))

    def retime(self, now: float, i: int, progress: Progress) -> None:
        """Running job ``i`` goes on at ``progress`` from ``now``."""
        self.progress[i] = progress
        self.on_retime(now, i, progress.end_s)

    def retime_partners(self, now: float, partners: list[int]) -> None:
        """The jobs whose GPU partners changed run at their new co-location factor from ``now``."""
        for j in partners:
            if j in self.progress and self.shared is not None:
                self.retime(now, j, self.progress[j].changed(now, factor=self.shared.factor(j)))

    def _join_shared(self, i: int, placements: tuple[Placement, ...]) -> list[int]:
        """Co-location: a typed single-worker job on part of a GPU joins that GPU's sharers; returns the partners
        whose speed this changed."""
        job = self.jobs[i]
        if self.shared is None or not job.job_type or len(placements) != 1:
            return []
        placement = placements[0]
        if placement.gpu_milli_each >= MILLI_PER_GPU or len(placement.gpu_indices) != 1:
            return []
        model = self.state.nodes[placement.node].gpu_model or ""
        joined = self.shared.join(i, job.job_type, (placement.node, placement.gpu_indices[0]), model)
        return [j for j in joined if j != i]
