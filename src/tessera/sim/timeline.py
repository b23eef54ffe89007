"""The timeline simulator: workloads arrive, wait, run for their duration and leave, on one scheduling core.

Each event time (arrivals, then departures that free capacity) is followed by scheduling steps of the same
``tessera.core.scheduler.Scheduler`` the control plane runs, until a step binds nothing. Pending workloads are kept
grouped by request shape: within a step a shape that did not fit is not retried, and after a failure it is retried
only once capacity has been released since (binds alone never make a failed request fit).

Baselines are configurations of that one scheduler (``TIMELINE_POLICIES``):

- ``static``: whole GPUs per workload (a fractional request takes a whole GPU), strict FIFO, no sharing: the static
  binding Tessera replaces;
- ``fifo-share``: fractional GPUs, strict FIFO, best-fit placement;
- ``tessera``: fractional GPUs, priority order with backfill (BestEffortFIFO), Tessera's placement policy.

Called by ``tessera simulate timeline`` and the benchmarks.
"""

from __future__ import annotations

import dataclasses
import time
from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

from tessera.core.cluster import ClusterState, NodeSpec
from tessera.core.errors import InvalidRequestError
from tessera.core.fragmentation import typical_pods
from tessera.core.placement import Placer, make_policy
from tessera.core.scheduler import PendingWorkload, QueueDiscipline, Scheduler, SchedulerConfig
from tessera.core.throughput import ThroughputModel
from tessera.core.workload import MILLI_PER_GPU, Placement, Request
from tessera.sim.events import EventLoop

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
class TimelinePolicy:
    name: str
    placement: str  # placement policy name (tessera.core.placement)
    whole_gpus: bool  # round every GPU share up to whole GPUs (static binding)
    discipline: QueueDiscipline


TIMELINE_POLICIES: dict[str, TimelinePolicy] = {
    "static": TimelinePolicy("static", "bestfit", True, QueueDiscipline.STRICT_FIFO),
    "fifo-share": TimelinePolicy("fifo-share", "bestfit", False, QueueDiscipline.STRICT_FIFO),
    "tessera": TimelinePolicy("tessera", "tessera", False, QueueDiscipline.BEST_EFFORT_FIFO),
}


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
    jain_index: float = 1.0  # over queues of received / requested GPU-seconds (1.0: one queue)

    @property
    def jct_s(self) -> FloatArray:
        return self.finish_s - self.arrival_s

    @property
    def wait_s(self) -> FloatArray:
        return self.start_s - self.arrival_s


def whole_gpu_request(request: Request) -> Request:
    """The request as static binding sees it: any GPU share becomes whole GPUs."""
    if request.num_gpus == 0 or request.gpu_milli == MILLI_PER_GPU:
        return request
    return dataclasses.replace(request, gpu_milli=MILLI_PER_GPU, gpu_mem_mib=0)


def resolve_policy(name: str) -> TimelinePolicy:
    policy = TIMELINE_POLICIES.get(name)
    if policy is None:
        known = ", ".join(TIMELINE_POLICIES)
        raise InvalidRequestError("--policies", f"unknown timeline policy {name!r} (known: {known})")
    return policy


def run_timeline(
    nodes: Sequence[NodeSpec],
    jobs: Sequence[TimelineJobLike],
    policy_name: str,
    seed: int = 0,
    throughput: ThroughputModel | None = None,
) -> TimelineResult:
    """Replay ``jobs`` on ``nodes`` under one policy; every job either finishes or never fits.

    A job without ``duration_s`` runs ``work_steps / throughput(job_type, model)`` seconds on the GPU model it got.
    """
    return _Replay(nodes, jobs, resolve_policy(policy_name), seed, throughput or ThroughputModel({})).run()


class _Replay:
    def __init__(
        self,
        nodes: Sequence[NodeSpec],
        jobs: Sequence[TimelineJobLike],
        policy: TimelinePolicy,
        seed: int,
        throughput: ThroughputModel,
    ):
        self.policy = policy
        self.rng = np.random.default_rng(seed)
        self.throughput = throughput
        self.jobs = [j for j in jobs if j.duration_s is not None or j.work_steps is not None]
        self.requests = [whole_gpu_request(j.request) if policy.whole_gpus else j.request for j in self.jobs]
        self.state = ClusterState(sorted(nodes, key=lambda n: n.name))
        typical = typical_pods(self.requests)
        placer = Placer(self.state, make_policy(policy.placement, typical, self.state.model_names))
        self.scheduler = Scheduler(placer, SchedulerConfig(discipline=policy.discipline))
        self.start_s = np.full(len(self.jobs), np.nan)
        self.finish_s = np.full(len(self.jobs), np.nan)
        self.placements: dict[int, tuple[Placement, ...]] = {}
        self.fifo: deque[int] = deque()  # strict FIFO: job indices in arrival order
        self.groups: OrderedDict[tuple[Request, int, int], deque[int]] = OrderedDict()  # backfill: by shape
        self.failed_at_release: dict[tuple[Request, int, int], int] = {}
        self.releases = 0
        self.allocated_milli = 0
        self.alloc_integral = 0.0
        self.last_s = 0.0
        self.alloc_times: list[float] = []
        self.alloc_values: list[float] = []

    def run(self) -> TimelineResult:
        started = time.perf_counter()
        loop: EventLoop[tuple[str, int]] = EventLoop()
        order = sorted(range(len(self.jobs)), key=lambda i: (self.jobs[i].arrival_s, self.jobs[i].id))
        for i in order:
            loop.schedule(self.jobs[i].arrival_s, ("arrive", i), priority=1)
        first = self.jobs[order[0]].arrival_s if order else 0.0
        self.last_s = first
        loop.run(lambda now, event: self._handle(loop, now, event))
        done = ~np.isnan(self.finish_s)
        span = max(float(np.nanmax(self.finish_s)) - first, 1e-9) if done.any() else 1e-9
        capacity = self.state.gpu_capacity_milli
        return TimelineResult(
            self.policy.name,
            np.array([self.jobs[i].arrival_s for i in np.flatnonzero(done)]),
            self.start_s[done],
            self.finish_s[done],
            100.0 * self.alloc_integral / (span * capacity) if capacity else 0.0,
            int((~done).sum()),
            time.perf_counter() - started,
            np.array(self.alloc_times),
            np.array(self.alloc_values) * 100.0 / max(capacity, 1),
        )

    def _handle(self, loop: EventLoop[tuple[str, int]], now: float, event: tuple[str, int]) -> None:
        self._advance(now)
        kind, i = event
        if kind == "depart":
            for placement in self.placements.pop(i):
                self.state.release(placement)
                self.allocated_milli -= placement.total_gpu_milli
            self.releases += 1
        else:
            self._enqueue(i)
        upcoming = loop.next_time_s()
        if upcoming is None or upcoming > now:  # schedule once all events of this instant are in
            self._schedule(loop, now)
            self.alloc_times.append(now)
            self.alloc_values.append(self.allocated_milli)

    def _advance(self, now: float) -> None:
        self.alloc_integral += self.allocated_milli * (now - self.last_s)
        self.last_s = now

    def _enqueue(self, i: int) -> None:
        if self.policy.discipline is QueueDiscipline.STRICT_FIFO:
            self.fifo.append(i)
        else:
            self.groups.setdefault(self._shape(i), deque()).append(i)

    def _candidates(self) -> list[int]:
        if self.policy.discipline is QueueDiscipline.STRICT_FIFO:
            return list(self.fifo)[:64]
        heads = []
        for shape, members in self.groups.items():
            if self.failed_at_release.get(shape) != self.releases:
                heads.append(members[0])
        return heads

    def _shape(self, i: int) -> tuple[Request, int, int]:
        job = self.jobs[i]
        return (self.requests[i], job.gang, job.priority)

    def _schedule(self, loop: EventLoop[tuple[str, int]], now: float) -> None:
        while True:
            candidates = self._candidates()
            if not candidates:
                return
            pending = [
                PendingWorkload(
                    str(i), self.requests[i], self.jobs[i].arrival_s, self.jobs[i].priority, gang=self.jobs[i].gang
                )
                for i in candidates
            ]
            plan = self.scheduler.plan(pending, self.rng)
            for bind in plan.binds:
                self._start(loop, now, int(bind.workload_id), bind.placements)
            for job_id in plan.waiting:
                i = int(job_id)
                self.failed_at_release[self._shape(i)] = self.releases
            if not plan.binds:
                return

    def _start(self, loop: EventLoop[tuple[str, int]], now: float, i: int, placements: tuple[Placement, ...]) -> None:
        for placement in placements:
            self.state.bind(placement)
            self.allocated_milli += placement.total_gpu_milli
        self.placements[i] = placements
        if self.policy.discipline is QueueDiscipline.STRICT_FIFO:
            self.fifo.remove(i)
        else:
            shape = self._shape(i)
            members = self.groups[shape]
            members.remove(i)
            if not members:
                del self.groups[shape]
        duration = self._duration(i, placements)
        self.start_s[i] = now
        self.finish_s[i] = now + duration
        loop.schedule(now + duration, ("depart", i), priority=0)

    def _duration(self, i: int, placements: tuple[Placement, ...]) -> float:
        job = self.jobs[i]
        if job.duration_s is not None:
            return float(job.duration_s)
        model = self.state.nodes[placements[0].node].gpu_model or ""
        return float(job.work_steps or 0.0) / self.throughput.throughput(job.job_type or "", model)
