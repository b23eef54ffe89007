"""Elastic workloads (``SchedulerConfig.elastic``): start with what fits, grow into idle capacity, shrink to the
minimum for higher priority instead of being preempted whole; rigid workloads and the default config unaffected."""

import dataclasses

import numpy as np

from tessera.core.cluster import ClusterState, NodeSpec
from tessera.core.invariants import check_cluster
from tessera.core.placement import Placer, make_policy
from tessera.core.preemption import PreemptionPolicy
from tessera.core.queueing import ResourceVector
from tessera.core.queueing.quotas import Admission
from tessera.core.scheduler import PendingWorkload, RunningWorkload, Scheduler, SchedulerConfig, StepPlan
from tessera.core.step import IMPLICIT_QUEUE, placements_charge
from tessera.core.workload import Placement, Request

WORKER = Request(num_gpus=1, gpu_milli=1000, cpu_milli=1000)


def engine(elastic: bool = True, preempt: bool = True) -> Scheduler:
    state = ClusterState([NodeSpec("a", 32_000, 65_536, 2, "T4"), NodeSpec("b", 32_000, 65_536, 2, "T4")])
    config = SchedulerConfig(elastic=elastic, preemption=PreemptionPolicy() if preempt else None)
    return Scheduler(Placer(state, make_policy("bestfit")), config)


def running(
    workload_id: str,
    placements: tuple[Placement, ...],
    priority: int = 0,
    low: int | None = None,
    high: int | None = None,
) -> RunningWorkload:
    admission = Admission(IMPLICIT_QUEUE, "*", placements_charge(placements), ResourceVector.zero())
    return RunningWorkload(
        workload_id, "default", priority, placements, admission, 0.0, elastic_min=low, elastic_max=high
    )


def start(sched: Scheduler, plan: StepPlan, elastic: dict[str, tuple[int, int]]) -> list[RunningWorkload]:
    """Apply the plan's binds on the state (as a runtime would) and return them as running workloads."""
    started = []
    for bind in plan.binds:
        for placement in bind.placements:
            sched.state.bind(placement)
        low, high = elastic.get(bind.workload_id, (None, None))
        started.append(running(bind.workload_id, bind.placements, low=low, high=high))
    check_cluster(sched.state)
    return started


def occupy(sched: Scheduler, gpus: int) -> RunningWorkload:
    """A rigid, non-preemptible workload holding ``gpus`` whole GPUs."""
    plan = sched.plan([PendingWorkload("rigid", WORKER, 0.0, gang=gpus)], np.random.default_rng(0))
    (held,) = start(sched, plan, {})
    return dataclasses.replace(held, preemptible=False)


def test_an_elastic_job_starts_with_what_fits_and_a_rigid_one_waits() -> None:
    sched = engine()
    held = occupy(sched, 2)
    before = sched.state.gpu_free_milli.copy()
    elastic = PendingWorkload("elastic", WORKER, 1.0, gang=4, elastic_min=2)
    rigid = PendingWorkload("rigid-4", WORKER, 2.0, gang=4)
    plan = sched.plan([elastic, rigid], np.random.default_rng(0), [held])
    assert [(b.workload_id, len(b.placements)) for b in plan.binds] == [("elastic", 2)]
    assert "rigid-4" in plan.waiting and not plan.preempts and not plan.shrinks and not plan.grows
    assert np.array_equal(before, sched.state.gpu_free_milli)  # the plan leaves the state untouched


def test_below_its_minimum_an_elastic_job_waits() -> None:
    sched = engine()
    held = occupy(sched, 3)
    plan = sched.plan(
        [PendingWorkload("elastic", WORKER, 1.0, gang=4, elastic_min=2)], np.random.default_rng(0), [held]
    )
    assert not plan.binds and "elastic" in plan.waiting


def test_off_by_default_the_elastic_fields_are_ignored() -> None:
    sched = engine(elastic=False)
    held = occupy(sched, 2)
    grown = running("small", (), low=1, high=4)
    plan = sched.plan(
        [PendingWorkload("elastic", WORKER, 1.0, gang=4, elastic_min=2)], np.random.default_rng(0), [held, grown]
    )
    assert not plan.binds and not plan.grows and "elastic" in plan.waiting


def test_an_elastic_job_grows_into_freed_capacity_up_to_its_maximum() -> None:
    sched = engine()
    held = occupy(sched, 2)
    plan = sched.plan(
        [PendingWorkload("elastic", WORKER, 1.0, gang=3, elastic_min=1)], np.random.default_rng(0), [held]
    )
    (job,) = start(sched, plan, {"elastic": (1, 3)})
    assert len(job.placements) == 2
    for placement in held.placements:  # the rigid workload ends
        sched.state.release(placement)
    before = sched.state.gpu_free_milli.copy()
    plan = sched.plan([], np.random.default_rng(0), [job])
    assert [(g.workload_id, len(g.placements)) for g in plan.grows] == [("elastic", 1)]  # up to max 3, not 4
    assert np.array_equal(before, sched.state.gpu_free_milli)
    for placement in plan.grows[0].placements:
        sched.state.bind(placement)
    check_cluster(sched.state)
    assert int(sched.state.gpu_free_milli.sum()) == 1000


def test_no_growth_while_a_workload_waits() -> None:
    sched = engine()
    plan = sched.plan([PendingWorkload("elastic", WORKER, 0.0, gang=1)], np.random.default_rng(0))
    (job,) = start(sched, plan, {"elastic": (1, 4)})
    waiting = PendingWorkload("huge", WORKER, 1.0, gang=5)
    plan = sched.plan([waiting], np.random.default_rng(0), [job])
    assert not plan.grows and "huge" in plan.waiting
    plan = sched.plan([], np.random.default_rng(0), [job])
    assert [(g.workload_id, len(g.placements)) for g in plan.grows] == [("elastic", 3)]


def test_an_elastic_job_shrinks_to_its_minimum_instead_of_being_preempted() -> None:
    sched = engine()
    plan = sched.plan([PendingWorkload("elastic", WORKER, 0.0, gang=4, elastic_min=2)], np.random.default_rng(0))
    (job,) = start(sched, plan, {"elastic": (2, 4)})
    before = sched.state.gpu_free_milli.copy()
    urgent = PendingWorkload("urgent", WORKER, 1.0, priority=10, gang=2)
    plan = sched.plan([urgent], np.random.default_rng(0), [job])
    assert not plan.preempts
    assert [(s.workload_id, len(s.placements), s.preemptor) for s in plan.shrinks] == [("elastic", 2, "urgent")]
    assert [(b.workload_id, len(b.placements)) for b in plan.binds] == [("urgent", 2)]
    assert np.array_equal(before, sched.state.gpu_free_milli)
    for placement in plan.shrinks[0].placements:  # apply: shrinks first, then binds
        sched.state.release(placement)
    for placement in plan.binds[0].placements:
        sched.state.bind(placement)
    check_cluster(sched.state)
    assert int(sched.state.gpu_free_milli.sum()) == 0


def test_only_workers_above_the_minimum_are_given_back_and_only_to_higher_priority() -> None:
    sched = engine()
    plan = sched.plan([PendingWorkload("elastic", WORKER, 0.0, gang=4, elastic_min=2)], np.random.default_rng(0))
    (job,) = start(sched, plan, {"elastic": (2, 4)})
    same = PendingWorkload("same-priority", WORKER, 1.0, gang=1)
    plan = sched.plan([same], np.random.default_rng(0), [job])
    assert not plan.shrinks and not plan.binds
    big = PendingWorkload("needs-three", WORKER, 1.0, priority=10, gang=3)
    plan = sched.plan([big], np.random.default_rng(0), [job])
    assert not plan.shrinks  # two workers above the minimum are not enough: the preemption policy decides
    assert [p.workload_id for p in plan.preempts] == ["elastic"]


def test_with_elastic_on_rigid_workloads_get_the_same_plan() -> None:
    work = [PendingWorkload(f"w{i}", WORKER, float(i), gang=g, priority=i % 2) for i, g in enumerate((3, 2, 1, 1))]
    plans = []
    for elastic in (False, True):
        sched = engine(elastic=elastic)
        plans.append(sched.plan(work, np.random.default_rng(0)))
    assert plans[0] == plans[1]
