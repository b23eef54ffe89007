"""What the timeline simulator reads and returns: ``TimelineJobLike`` (a job as any workload generator hands it over),
``StartRecord`` (one start decision) and ``TimelineResult`` (one policy's run). Used by the replay
(``tessera.sim.replay.timeline``), its report (``tessera.sim.reports.timeline``) and the benchmarks.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

from tessera.core.scheduler import Applied
from tessera.core.workload import Request

FloatArray = npt.NDArray[np.float64]


class TimelineJobLike(Protocol):
    @property
    def id(self) -> str: ...
    @property
    def arrival_s(self) -> float: ...
    @property
    def request(self) -> Request: ...  # per worker
    @property
    def duration_s(self) -> float | None: ...  # None: runs work_steps at the chosen GPU model's throughput
    @property
    def work_steps(self) -> float | None: ...
    @property
    def job_type(self) -> str | None: ...
    @property
    def gang(self) -> int: ...
    @property
    def priority(self) -> int: ...


@dataclass(frozen=True, slots=True)
class StartRecord:
    """One start decision: job ``job_id`` at ``time_s`` on (node name, GPU indices, milli per GPU) per worker."""

    time_s: float
    job_id: str
    placements: tuple[tuple[str, tuple[int, ...], int], ...]


@dataclass(frozen=True, slots=True)
class TimelineResult:
    policy: str
    arrival_s: FloatArray  # per finished job
    start_s: FloatArray
    finish_s: FloatArray
    gpu_alloc_pct: float  # time-weighted allocated GPU share of capacity, first arrival to last finish
    unfinished: int  # jobs that never started (did not fit even on an empty cluster)
    wall_s: float
    alloc_times_s: FloatArray  # allocation over time: allocated GPU % of capacity from each time on
    alloc_pct: FloatArray
    preemptions: int = 0
    jain_index: float = 1.0  # over queues of received / entitled GPU-seconds in busy periods (1.0: no queues)
    queue_shares: dict[str, float] = dataclasses.field(default_factory=dict)  # queue -> received / entitled
    reclaims: int = 0  # preemptions that returned borrowed capacity to another queue
    reclaim_latency_max_s: float = 0.0  # longest time a reclaim that would let the owner run was not made
    blocked_by_borrowers_max_s: float = 0.0  # longest time a queue's quota-fitting work waited while others borrow
    starts: tuple[StartRecord, ...] = ()  # every (re)start in order: the decisions, to compare with a live run
    shrunk_workers: int = 0  # elastic jobs: workers given back (StepPlan.shrinks)
    grown_workers: int = 0  # elastic jobs: workers added (StepPlan.grows)
    # With run_timeline(record_decisions=True): every decision Scheduler.commit applied, with its quota change.
    decisions: tuple[Applied, ...] = ()

    @property
    def jct_s(self) -> FloatArray:
        return self.finish_s - self.arrival_s

    @property
    def wait_s(self) -> FloatArray:
        return self.start_s - self.arrival_s
