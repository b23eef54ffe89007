"""Elastic workloads (``SchedulerConfig.elastic``): start with what fits, grow into idle capacity, shrink to the
minimum for higher priority instead of being preempted whole; rigid workloads and the default config unaffected."""

import dataclasses

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tessera.core.cluster import ClusterState, NodeSpec
from tessera.core.demand import IMPLICIT_QUEUE
from tessera.core.elastic import grown_admission, placements_charge, shrunk_admission
from tessera.core.invariants import check_cluster, check_quotas
from tessera.core.placement import Placer, make_policy
from tessera.core.preemption import PreemptionPolicy
from tessera.core.queueing import ResourceVector
from tessera.core.queueing.quotas import Admission, QueueSpec
from tessera.core.scheduler import PendingWorkload, RunningWorkload, Scheduler, SchedulerConfig, StepPlan
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
    plan = sched.plan([PendingWorkload("rigid", WORKER, 0.0, gang=gpus)], rng=np.random.default_rng(0))
    (held,) = start(sched, plan, {})
    return dataclasses.replace(held, preemptible=False)


def test_an_elastic_job_starts_with_what_fits_and_a_rigid_one_waits() -> None:
    sched = engine()
    held = occupy(sched, 2)
    before = sched.state.gpu_free_milli.copy()
    elastic = PendingWorkload("elastic", WORKER, 1.0, gang=4, elastic_min=2)
    rigid = PendingWorkload("rigid-4", WORKER, 2.0, gang=4)
    plan = sched.plan([elastic, rigid], rng=np.random.default_rng(0), running=[held])
    assert [(b.workload_id, len(b.placements)) for b in plan.binds] == [("elastic", 2)]
    assert "rigid-4" in plan.waiting and not plan.preempts and not plan.shrinks and not plan.grows
    assert np.array_equal(before, sched.state.gpu_free_milli)  # the plan leaves the state untouched


def test_below_its_minimum_an_elastic_job_waits() -> None:
    sched = engine()
    held = occupy(sched, 3)
    plan = sched.plan(
        [PendingWorkload("elastic", WORKER, 1.0, gang=4, elastic_min=2)], rng=np.random.default_rng(0), running=[held]
    )
    assert not plan.binds and "elastic" in plan.waiting


def test_off_by_default_the_elastic_fields_are_ignored() -> None:
    sched = engine(elastic=False)
    held = occupy(sched, 2)
    grown = running("small", (), low=1, high=4)
    plan = sched.plan(
        [PendingWorkload("elastic", WORKER, 1.0, gang=4, elastic_min=2)],
        rng=np.random.default_rng(0),
        running=[held, grown],
    )
    assert not plan.binds and not plan.grows and "elastic" in plan.waiting


def test_an_elastic_job_grows_into_freed_capacity_up_to_its_maximum() -> None:
    sched = engine()
    held = occupy(sched, 2)
    plan = sched.plan(
        [PendingWorkload("elastic", WORKER, 1.0, gang=3, elastic_min=1)], rng=np.random.default_rng(0), running=[held]
    )
    (job,) = start(sched, plan, {"elastic": (1, 3)})
    assert len(job.placements) == 2
    for placement in held.placements:  # the rigid workload ends
        sched.state.release(placement)
    before = sched.state.gpu_free_milli.copy()
    plan = sched.plan([], rng=np.random.default_rng(0), running=[job])
    assert [(g.workload_id, len(g.placements)) for g in plan.grows] == [("elastic", 1)]  # up to max 3, not 4
    assert np.array_equal(before, sched.state.gpu_free_milli)
    for placement in plan.grows[0].placements:
        sched.state.bind(placement)
    check_cluster(sched.state)
    assert int(sched.state.gpu_free_milli.sum()) == 1000


def test_no_growth_while_a_workload_waits() -> None:
    sched = engine()
    plan = sched.plan([PendingWorkload("elastic", WORKER, 0.0, gang=1)], rng=np.random.default_rng(0))
    (job,) = start(sched, plan, {"elastic": (1, 4)})
    waiting = PendingWorkload("huge", WORKER, 1.0, gang=5)
    plan = sched.plan([waiting], rng=np.random.default_rng(0), running=[job])
    assert not plan.grows and "huge" in plan.waiting
    plan = sched.plan([], rng=np.random.default_rng(0), running=[job])
    assert [(g.workload_id, len(g.placements)) for g in plan.grows] == [("elastic", 3)]


def test_an_elastic_job_shrinks_to_its_minimum_instead_of_being_preempted() -> None:
    sched = engine()
    plan = sched.plan([PendingWorkload("elastic", WORKER, 0.0, gang=4, elastic_min=2)], rng=np.random.default_rng(0))
    (job,) = start(sched, plan, {"elastic": (2, 4)})
    before = sched.state.gpu_free_milli.copy()
    urgent = PendingWorkload("urgent", WORKER, 1.0, priority=10, gang=2)
    plan = sched.plan([urgent], rng=np.random.default_rng(0), running=[job])
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
    plan = sched.plan([PendingWorkload("elastic", WORKER, 0.0, gang=4, elastic_min=2)], rng=np.random.default_rng(0))
    (job,) = start(sched, plan, {"elastic": (2, 4)})
    same = PendingWorkload("same-priority", WORKER, 1.0, gang=1)
    plan = sched.plan([same], rng=np.random.default_rng(0), running=[job])
    assert not plan.shrinks and not plan.binds
    big = PendingWorkload("needs-three", WORKER, 1.0, priority=10, gang=3)
    plan = sched.plan([big], rng=np.random.default_rng(0), running=[job])
    assert not plan.shrinks  # two workers above the minimum are not enough: the preemption policy decides
    assert [p.workload_id for p in plan.preempts] == ["elastic"]


def test_with_elastic_on_rigid_workloads_get_the_same_plan() -> None:
    work = [PendingWorkload(f"w{i}", WORKER, float(i), gang=g, priority=i % 2) for i, g in enumerate((3, 2, 1, 1))]
    plans = []
    for elastic in (False, True):
        sched = engine(elastic=elastic)
        plans.append(sched.plan(work, rng=np.random.default_rng(0)))
    assert plans[0] == plans[1]


# ---------------------------------------------------------------------------------------------- with queues

GPUS = ResourceVector(1000, 1000, 0)  # one WORKER's charge


def queued_engine(*queues: QueueSpec, policy: PreemptionPolicy | None = None) -> Scheduler:
    state = ClusterState([NodeSpec("a", 32_000, 65_536, 2, "T4"), NodeSpec("b", 32_000, 65_536, 2, "T4")])
    config = SchedulerConfig(elastic=True, queues=queues, preemption=policy or PreemptionPolicy())
    return Scheduler(Placer(state, make_policy("bestfit")), config)


def workers(n: int) -> ResourceVector:
    return ResourceVector(1000 * n, 1000 * n, 0)


class Runtime:
    """Applies plans as a runtime does (shrinks, preempts, binds, grows), charging the scheduler's ledger, and
    checks the cluster and the quota rules after each."""

    def __init__(self, sched: Scheduler) -> None:
        self.sched = sched
        self.running: dict[str, RunningWorkload] = {}

    def step(self, pending: list[PendingWorkload], now: float = 0.0, seed: int = 0) -> StepPlan:
        plan = self.sched.plan(pending, now, rng=np.random.default_rng(seed), running=list(self.running.values()))
        by_id = {w.workload_id: w for w in pending}
        state = self.sched.state
        for shrink in plan.shrinks:
            r = self.running[shrink.workload_id]
            for placement in shrink.placements:
                state.release(placement)
            kept, given = shrunk_admission(r.admission, placements_charge(shrink.placements))
            assert given == shrink.admission
            self.sched.release(shrink.admission)
            left = tuple(p for p in r.placements if p not in shrink.placements)
            assert len(left) >= (r.elastic_min or 0)
            self.running[r.workload_id] = dataclasses.replace(r, placements=left, admission=kept)
        for preempt in plan.preempts:
            r = self.running.pop(preempt.workload_id)
            for placement in r.placements:
                state.release(placement)
            self.sched.release(r.admission)
        for bind in plan.binds:
            w = by_id[bind.workload_id]
            for placement in bind.placements:
                state.bind(placement)
            admission = self.sched.charge(bind)
            assert admission is not None
            high = None if w.elastic_min is None else 2 * w.gang
            self.running[w.workload_id] = RunningWorkload(
                w.workload_id, w.queue, w.priority, bind.placements, admission, now, w.preemptible,
                elastic_min=w.elastic_min, elastic_max=high, gang=w.gang,
            )  # fmt: skip
        for grow in plan.grows:
            r = self.running[grow.workload_id]
            for placement in grow.placements:
                state.bind(placement)
            added = self.sched.charge(grow)
            assert added is not None and added.charged == placements_charge(grow.placements)
            admission = grown_admission(r.admission, added)
            self.running[r.workload_id] = dataclasses.replace(
                r, placements=r.placements + grow.placements, admission=admission
            )
        self.check()
        return plan

    def finish(self, workload_id: str) -> None:
        r = self.running.pop(workload_id)
        for placement in r.placements:
            self.sched.state.release(placement)
        self.sched.release(r.admission)
        self.check()

    def check(self) -> None:
        check_cluster(self.sched.state, [p for r in self.running.values() for p in r.placements])
        assert self.sched.ledger is not None
        check_quotas(self.sched.ledger)
        for spec in self.sched.ledger.queues:  # the ledger holds exactly the running workloads' admissions
            held = [r.admission for r in self.running.values() if r.queue == spec.name]
            assert self.sched.ledger.usage(spec.name, "*") == placements_charge(
                [p for r in self.running.values() if r.queue == spec.name for p in r.placements]
            )
            for admission in held:
                assert admission.charged == placements_charge(self.running_of(admission).placements)

    def running_of(self, admission: Admission) -> RunningWorkload:
        return next(r for r in self.running.values() if r.admission is admission)


def test_with_a_queue_growth_is_charged_and_stops_at_the_nominal_quota() -> None:
    sched = queued_engine(QueueSpec("a", None, {"*": workers(3)}))
    run = Runtime(sched)
    run.step([PendingWorkload("e", WORKER, 0.0, queue="a", gang=1, elastic_min=1)])  # runs with max 2
    run.running["e"] = dataclasses.replace(run.running["e"], elastic_max=4)
    plan = run.step([])
    assert [(g.workload_id, len(g.placements)) for g in plan.grows] == [("e", 2)]  # 3 = nominal, not 4 (free)
    (grow,) = plan.grows
    assert grow.admission == Admission("a", "*", workers(2), ResourceVector.zero())
    assert run.running["e"].admission.charged == workers(3)
    assert not run.step([]).grows  # at the quota: no more


def test_growth_borrows_only_for_a_preemptible_workload_in_a_cohort() -> None:
    for preemptible, expected in ((True, 4), (False, 2)):  # a non-preemptible one could not give workers back
        sched = queued_engine(QueueSpec("a", "c", {"*": workers(2)}), QueueSpec("b", "c", {"*": workers(2)}))
        run = Runtime(sched)
        elastic = PendingWorkload("e", WORKER, 0.0, queue="a", gang=2, elastic_min=1, preemptible=preemptible)
        run.step([elastic])  # elastic_max 4
        run.step([])
        assert len(run.running["e"].placements) == expected
        borrowed = run.running["e"].admission.borrowed
        assert borrowed == (workers(2) if preemptible else ResourceVector.zero())


def test_borrowed_growth_is_reclaimed_by_a_shrink_before_any_preemption() -> None:
    sched = queued_engine(QueueSpec("a", "c", {"*": workers(2)}), QueueSpec("b", "c", {"*": workers(2)}))
    run = Runtime(sched)
    run.step([PendingWorkload("e", WORKER, 0.0, queue="a", gang=2, elastic_min=1)])
    run.step([])
    assert run.running["e"].admission.borrowed == workers(2)
    owner = PendingWorkload("owner", WORKER, 1.0, queue="b", gang=2, priority=-5)  # lower priority: reclaim anyway
    plan = run.step([owner], now=1.0)
    assert not plan.preempts
    assert [(s.workload_id, len(s.placements), s.preemptor) for s in plan.shrinks] == [("e", 2, "owner")]
    assert plan.shrinks[0].admission == Admission("a", "*", ResourceVector.zero(), workers(2))
    assert [(b.workload_id, len(b.placements)) for b in plan.binds] == [("owner", 2)]
    assert run.running["e"].admission == Admission("a", "*", workers(2), ResourceVector.zero())
    assert not run.step([], now=2.0).grows  # the cohort is full: no growth back


def test_a_queue_that_would_borrow_does_not_shrink_another_borrower() -> None:
    sched = queued_engine(
        QueueSpec("a", "c", {"*": workers(2)}),
        QueueSpec("b", "c", {"*": workers(2)}),
        QueueSpec("d", "c", {"*": workers(0)}),
    )
    run = Runtime(sched)
    run.step([PendingWorkload("e", WORKER, 0.0, queue="a", gang=2, elastic_min=1)])
    run.step([])
    assert run.running["e"].admission.borrowed == workers(2)
    plan = run.step([PendingWorkload("d1", WORKER, 1.0, queue="d", priority=50)], now=1.0)
    assert not plan.shrinks and not plan.binds and "d1" in plan.waiting  # reclaim is for nominal quota only


def test_a_shrink_never_takes_nominal_quota_of_another_queue() -> None:
    # e runs within a's nominal quota; b's higher-priority work may not shrink it (priority acts within a queue).
    sched = queued_engine(QueueSpec("a", "c", {"*": workers(4)}), QueueSpec("b", "c", {"*": workers(0)}))
    run = Runtime(sched)
    run.step([PendingWorkload("e", WORKER, 0.0, queue="a", gang=4, elastic_min=1)])
    plan = run.step([PendingWorkload("b1", WORKER, 1.0, queue="b", priority=50)], now=1.0)
    assert not plan.shrinks and not plan.binds and not plan.preempts
    plan = run.step([PendingWorkload("a1", WORKER, 1.0, queue="a", priority=50)], now=1.0)
    assert [(s.workload_id, len(s.placements)) for s in plan.shrinks] == [("e", 1)]
    assert plan.shrinks[0].admission == Admission("a", "*", workers(1), ResourceVector.zero())


def test_no_growth_while_a_workload_of_the_cohort_waits_for_quota() -> None:
    sched = queued_engine(
        QueueSpec("a", "c", {"*": workers(2)}),
        QueueSpec("b", "c", {"*": workers(1)}, borrowing_limit={"*": ResourceVector.zero()}),
        QueueSpec("d", "c", {"*": workers(1)}),
    )
    run = Runtime(sched)
    elastic = PendingWorkload("e", WORKER, 0.0, queue="a", gang=2, elastic_min=1)
    waiting = PendingWorkload("b2", WORKER, 0.0, queue="b")  # b at its nominal quota may not borrow: it waits
    plan = run.step([PendingWorkload("b1", WORKER, 0.0, queue="b"), elastic, waiting])
    assert "b2" in plan.waiting and not plan.grows
    plan = run.step([waiting], now=1.0)
    assert "b2" in plan.waiting and not plan.grows
    plan = run.step([], now=2.0)
    assert [(g.workload_id, len(g.placements)) for g in plan.grows] == [("e", 1)]  # d's unused quota, borrowed
    assert run.running["e"].admission.borrowed == workers(1)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.tuples(st.sampled_from([None, "c", "c"]), st.integers(1, 3), st.booleans()), min_size=1, max_size=3),
    st.lists(
        st.tuples(
            st.integers(0, 2),  # queue index
            st.integers(0, 2),  # priority
            st.integers(1, 3),  # gang
            st.booleans(),  # elastic
            st.booleans(),  # preemptible
            st.integers(0, 2),  # running workloads that finish before this one arrives
        ),
        min_size=1,
        max_size=12,
    ),
)
def test_resizes_keep_every_quota_rule_and_the_charges_exact(
    queue_draws: list[tuple[str | None, int, bool]], arrivals: list[tuple[int, int, int, bool, bool, int]]
) -> None:
    queues = [
        QueueSpec(f"q{i}", cohort, {"*": workers(n)}, borrowing_limit={"*": workers(1)} if cohort and lim else None)
        for i, (cohort, n, lim) in enumerate(queue_draws)
    ]
    run = Runtime(queued_engine(*queues))
    pending: list[PendingWorkload] = []
    originals: dict[str, PendingWorkload] = {}
    for t, (q, priority, gang, elastic, preemptible, finish) in enumerate(arrivals):
        for workload_id in sorted(run.running)[:finish]:
            run.finish(workload_id)
        queue = queues[q % len(queues)].name
        low = max(1, gang - 1) if elastic else None
        arrival = PendingWorkload(f"w{t}", WORKER, float(t), priority, queue, gang, preemptible, elastic_min=low)
        originals[arrival.workload_id] = arrival
        # Each arrival's step, then a step after the workloads still waiting are withdrawn (growth may follow).
        for now, offered in ((float(t), [*pending, arrival]), (t + 0.5, [])):
            before = dict(run.running)
            ledger = run.sched.ledger
            assert ledger is not None
            borrowing = {q.name for q in queues if not ledger.borrowed(q.name, "*").is_zero()}
            plan = run.step(offered, now=now, seed=t)  # checks the cluster, the quota rules and every charge
            assert not {s.workload_id for s in plan.shrinks} & {g.workload_id for g in plan.grows}
            for shrink in plan.shrinks:
                victim, preemptor = before[shrink.workload_id], originals[shrink.preemptor]
                assert (
                    victim.elastic_min is not None
                    and len(victim.placements) - len(shrink.placements) >= victim.elastic_min
                )
                grown_only = len(victim.placements) - len(shrink.placements) >= (victim.gang or 0)
                # Growth back to anyone of its queue; else strictly higher priority, or a queue taking its quota back.
                assert grown_only or victim.priority < preemptor.priority or victim.queue != preemptor.queue
                if victim.queue != preemptor.queue:  # reclaim: only from a queue above its nominal quota
                    assert victim.queue in borrowing and queues_cohort(queues, victim.queue) is not None
            if plan.grows:
                assert not plan.preempts
                for workload_id, reason in plan.waiting.items():  # only for quota, elsewhere than the growth
                    waiter = originals[workload_id]
                    assert "no quota left" in reason
                    for grow in plan.grows:
                        grown = before[grow.workload_id]
                        assert grown.queue != waiter.queue
                        assert queues_cohort(queues, grown.queue) in (None,) or (
                            queues_cohort(queues, grown.queue) != queues_cohort(queues, waiter.queue)
                        )
                assert all(before[g.workload_id].preemptible for g in plan.grows)
            started = {b.workload_id for b in plan.binds}
            pending = [w for w in offered if w.workload_id not in started] if offered else pending
            pending += [originals[p.workload_id] for p in plan.preempts]
        pending = [w for w in pending if w.workload_id != arrival.workload_id or w.preemptible]


def queues_cohort(queues: list[QueueSpec], name: str) -> str | None:
    return next(q.cohort for q in queues if q.name == name)


def test_grown_workers_go_to_a_pending_workload_of_any_priority_and_placement_ignores_them() -> None:
    sched = engine()
    plan = sched.plan([PendingWorkload("e", WORKER, 0.0, gang=1, elastic_min=1)], rng=np.random.default_rng(0))
    (job,) = start(sched, plan, {"e": (1, 4)})
    job = dataclasses.replace(job, gang=1)
    plan = sched.plan([], rng=np.random.default_rng(0), running=[job])
    for placement in plan.grows[0].placements:
        sched.state.bind(placement)
    job = dataclasses.replace(job, placements=job.placements + plan.grows[0].placements)
    assert len(job.placements) == 4  # the whole cluster
    low = PendingWorkload("low", WORKER, 1.0, priority=-10, gang=2)  # lower priority than e: growth yields anyway
    plan = sched.plan([low], rng=np.random.default_rng(0), running=[job])
    assert not plan.preempts and [(b.workload_id, len(b.placements)) for b in plan.binds] == [("low", 2)]
    assert [(s.workload_id, len(s.placements)) for s in plan.shrinks] == [("e", 2)]
    assert set(plan.shrinks[0].placements) <= set(job.placements[1:])  # never below its gang of 1
    # Workers between the minimum and the gang still go only to strictly higher priority.
    rigid_size = dataclasses.replace(job, gang=4, elastic_min=2)
    plan = sched.plan([low], rng=np.random.default_rng(0), running=[rigid_size])
    assert not plan.binds and not plan.shrinks


def test_a_non_preemptible_elastic_workload_never_grows() -> None:
    sched = engine()
    plan = sched.plan([PendingWorkload("e", WORKER, 0.0, gang=1, elastic_min=1)], rng=np.random.default_rng(0))
    (job,) = start(sched, plan, {"e": (1, 4)})
    plan = sched.plan([], rng=np.random.default_rng(0), running=[dataclasses.replace(job, preemptible=False)])
    assert not plan.grows  # it could never give the workers back
    assert [len(g.placements) for g in sched.plan([], rng=np.random.default_rng(0), running=[job]).grows] == [3]
