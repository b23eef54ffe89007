"""The scheduling step: ``Scheduler.plan(pending, running, now_s) -> StepPlan``, decisions as data.

One step takes the workloads waiting to run, orders them (priority, then arrival; a queue discipline decides whether
a workload that does not fit blocks those behind it), and places what fits with the configured placement policy.
It never launches anything and never reads a clock: the simulator and the control plane apply the ``Bind`` and
``Preempt`` decisions themselves (``ClusterState.bind`` / ``release``) and call ``plan`` again after the next event.
Placements within one step are tried on the live ``ClusterState`` and rolled back before ``plan`` returns, so the
returned plan is consistent (no two binds overlap) and the state is left untouched.

Gang workloads (``gang > 1`` workers of the same request) are placed all or nothing. A request that does not fit
leaves a one-line reason in ``StepPlan.waiting`` (shown by ``tessera show`` in the control plane).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from tessera.core.cluster import ClusterState
from tessera.core.placement.base import Placer
from tessera.core.queueing.priority import order_pending
from tessera.core.workload import Placement, Request


class QueueDiscipline(enum.Enum):
    STRICT_FIFO = "StrictFIFO"  # the first workload that does not fit blocks everything behind it
    BEST_EFFORT_FIFO = "BestEffortFIFO"  # later workloads that fit may start (backfill)


@dataclass(frozen=True, slots=True)
class PendingWorkload:
    workload_id: str
    request: Request  # per worker
    arrival_s: float
    priority: int = 0
    queue: str = "default"
    gang: int = 1  # workers placed all or nothing


@dataclass(frozen=True, slots=True)
class Bind:
    workload_id: str
    placements: tuple[Placement, ...]  # one per worker


@dataclass(frozen=True, slots=True)
class StepPlan:
    binds: tuple[Bind, ...] = ()
    waiting: dict[str, str] = field(default_factory=dict)  # workload id -> why it is still pending


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    discipline: QueueDiscipline = QueueDiscipline.BEST_EFFORT_FIFO
    max_attempts_per_step: int = 10_000  # bound on placement attempts in one step (keeps a step's cost bounded)


class Scheduler:
    """Plans binds for pending workloads on one cluster with one placement engine."""

    def __init__(self, placer: Placer, config: SchedulerConfig = SchedulerConfig()) -> None:
        self.placer = placer
        self.config = config

    @property
    def state(self) -> ClusterState:
        return self.placer.state

    def plan(self, pending: Sequence[PendingWorkload], rng: np.random.Generator) -> StepPlan:
        binds: list[Bind] = []
        waiting: dict[str, str] = {}
        tried: list[Placement] = []
        blocked_shapes: set[tuple[Request, int]] = set()
        attempts = 0
        blocked = False
        try:
            for workload in order_pending(pending):
                shape = (workload.request, workload.gang)
                if blocked or shape in blocked_shapes or attempts >= self.config.max_attempts_per_step:
                    waiting[workload.workload_id] = (
                        "waiting behind an earlier workload" if blocked else _no_fit(workload)
                    )
                    continue
                attempts += 1
                placements = self._place_gang(workload, rng, tried)
                if placements is None:
                    waiting[workload.workload_id] = _no_fit(workload)
                    blocked_shapes.add(shape)  # the state only fills up during a step: the same shape fails too
                    blocked = self.config.discipline is QueueDiscipline.STRICT_FIFO
                    continue
                binds.append(Bind(workload.workload_id, placements))
        finally:
            for placement in reversed(tried):
                self.state.release(placement)
        return StepPlan(tuple(binds), waiting)

    def _place_gang(
        self, workload: PendingWorkload, rng: np.random.Generator, tried: list[Placement]
    ) -> tuple[Placement, ...] | None:
        placed: list[Placement] = []
        for _ in range(workload.gang):
            decision = self.placer.decide(workload.request, rng)
            if decision is None:
                for placement in reversed(placed):
                    self.state.release(placement)
                    tried.remove(placement)
                return None
            self.state.bind(decision)
            tried.append(decision)
            placed.append(decision)
        return tuple(placed)


def _no_fit(workload: PendingWorkload) -> str:
    r = workload.request
    if r.num_gpus == 0:
        what = f"{r.cpu_milli / 1000:g} CPUs"
    elif r.is_sharing:
        what = f"a GPU with {r.gpu_milli / 10:g}% free"
    else:
        what = f"{r.num_gpus} free GPU{'s' if r.num_gpus > 1 else ''}"
    types = f" of type {'/'.join(sorted(r.gpu_types))}" if r.gpu_types and r.num_gpus else ""
    gang = f" for each of {workload.gang} workers" if workload.gang > 1 else ""
    return f"no node has {what}{types} and {r.cpu_milli / 1000:g} CPUs free{gang}"
