"""The scheduling step: ordering, strict FIFO vs backfill, gangs all or nothing, and a side-effect-free plan."""

import numpy as np

from tessera.core.cluster import ClusterState, NodeSpec
from tessera.core.placement import Placer, make_policy
from tessera.core.scheduler import PendingWorkload, QueueDiscipline, Scheduler, SchedulerConfig
from tessera.core.workload import Request

BIG = Request(num_gpus=4, gpu_milli=1000, cpu_milli=1000)
SMALL = Request(num_gpus=1, gpu_milli=500, cpu_milli=1000)


def scheduler(discipline: QueueDiscipline) -> Scheduler:
    state = ClusterState([NodeSpec("a", 32_000, 65_536, 2, "T4"), NodeSpec("b", 32_000, 65_536, 2, "T4")])
    return Scheduler(Placer(state, make_policy("bestfit")), SchedulerConfig(discipline=discipline))


def pending() -> list[PendingWorkload]:
    return [
        PendingWorkload("late-small", SMALL, arrival_s=5.0),
        PendingWorkload("early-big", BIG, arrival_s=1.0),
        PendingWorkload("urgent", SMALL, arrival_s=9.0, priority=10),
    ]


def test_strict_fifo_blocks_behind_a_head_that_does_not_fit() -> None:
    plan = scheduler(QueueDiscipline.STRICT_FIFO).plan(pending(), rng=np.random.default_rng(0))
    assert [b.workload_id for b in plan.binds] == ["urgent"]  # priority first, then the big head blocks
    assert (
        plan.waiting["late-small"]
        == f"behind workload early-big (StrictFIFO), which waits: {plan.waiting['early-big']}"
    )
    assert "4 free GPUs" in plan.waiting["early-big"]


def test_backfill_lets_later_workloads_that_fit_start() -> None:
    plan = scheduler(QueueDiscipline.BEST_EFFORT_FIFO).plan(pending(), rng=np.random.default_rng(0))
    assert [b.workload_id for b in plan.binds] == ["urgent", "late-small"]


def test_a_gang_is_placed_whole_or_not_at_all_and_plan_leaves_the_state_untouched() -> None:
    engine = scheduler(QueueDiscipline.BEST_EFFORT_FIFO)
    before = engine.state.gpu_free_milli.copy()
    whole = Request(num_gpus=1, gpu_milli=1000, cpu_milli=1000)
    plan = engine.plan(
        [PendingWorkload("gang-of-5", whole, 0.0, gang=5), PendingWorkload("gang-of-3", whole, 1.0, gang=3)],
        rng=np.random.default_rng(0),
    )
    assert [(b.workload_id, len(b.placements)) for b in plan.binds] == [("gang-of-3", 3)]
    assert "each of 5 workers" in plan.waiting["gang-of-5"]
    assert np.array_equal(before, engine.state.gpu_free_milli)
    nodes_used = {p.node for p in plan.binds[0].placements}
    assert len(nodes_used) == 2  # 3 whole GPUs need both 2-GPU nodes; no GPU is used twice
    gpus = [(p.node, p.gpu_indices) for p in plan.binds[0].placements]
    assert len(set(gpus)) == 3


# ---------------------------------------------------------------------------------------------- queues and quotas

from tessera.core.preemption import PreemptionPolicy  # noqa: E402
from tessera.core.queueing import QueueSpec, ResourceVector  # noqa: E402
from tessera.core.queueing.quotas import Admission  # noqa: E402
from tessera.core.scheduler import Bind, RunningWorkload  # noqa: E402
from tessera.core.workload import Placement  # noqa: E402


def gpus(count: int) -> dict[str, ResourceVector]:
    return {"*": ResourceVector(count * 1000, 64_000, 131_072)}


def quota_scheduler(*queues: QueueSpec, preempt: bool = False) -> Scheduler:
    state = ClusterState([NodeSpec("a", 32_000, 65_536, 2, "T4"), NodeSpec("b", 32_000, 65_536, 2, "T4")])
    config = SchedulerConfig(queues=queues, preemption=PreemptionPolicy() if preempt else None)
    return Scheduler(Placer(state, make_policy("bestfit")), config)


def one_gpu(queue: str) -> Request:
    return Request(num_gpus=1, gpu_milli=1000, cpu_milli=1000, queue=queue)


def apply(engine: Scheduler, plan_binds: tuple[Bind, ...], now_s: float = 0.0) -> list[RunningWorkload]:
    running = []
    for bind in plan_binds:
        for placement in bind.placements:
            engine.state.bind(placement)
        admission = engine.charge(bind)
        assert admission is not None
        queue = admission.queue
        running.append(RunningWorkload(bind.workload_id, queue, 0, bind.placements, admission, now_s))
    return running


def test_borrowing_stays_within_the_borrowing_limit_of_the_cohort() -> None:
    engine = quota_scheduler(QueueSpec("a", "org", gpus(2)), QueueSpec("b", "org", gpus(2), borrowing_limit=gpus(1)))
    pending = [PendingWorkload(f"b{i}", one_gpu("b"), float(i), queue="b") for i in range(4)]
    plan = engine.plan(pending, rng=np.random.default_rng(0))
    assert [b.workload_id for b in plan.binds] == ["b0", "b1", "b2"]
    assert plan.binds[2].admission is not None and plan.binds[2].admission.is_borrowing
    assert "quota" in plan.waiting["b3"]


def test_a_queue_without_a_cohort_never_exceeds_its_nominal_quota() -> None:
    engine = quota_scheduler(QueueSpec("a", None, gpus(2)), QueueSpec("b", None, gpus(2)))
    pending = [PendingWorkload(f"b{i}", one_gpu("b"), float(i), queue="b") for i in range(4)]
    assert len(engine.plan(pending, rng=np.random.default_rng(0)).binds) == 2


def test_the_owner_reclaims_borrowed_capacity_in_one_step() -> None:
    engine = quota_scheduler(QueueSpec("a", "org", gpus(2)), QueueSpec("b", "org", gpus(2)), preempt=True)
    rng = np.random.default_rng(0)
    borrowed = [PendingWorkload(f"b{i}", one_gpu("b"), float(i), queue="b") for i in range(4)]
    running = apply(engine, engine.plan(borrowed, rng=rng).binds)
    assert len(running) == 4  # b uses a's idle quota
    owner = [PendingWorkload(f"a{i}", one_gpu("a"), 10.0, queue="a") for i in range(2)]
    plan = engine.plan(owner, 10.0, rng=rng, running=running)
    assert sorted(p.workload_id for p in plan.preempts) == ["b2", "b3"]  # the borrowed (youngest) ones
    assert all(p.reason.startswith("reclaim") for p in plan.preempts)
    assert [b.workload_id for b in plan.binds] == ["a0", "a1"]
    assert plan.binds[0].admission is not None and not plan.binds[0].admission.is_borrowing
    # b within its nominal quota is never reclaimed: a third job of a does not preempt
    for preempt in plan.preempts:
        victim = next(r for r in running if r.workload_id == preempt.workload_id)
        for placement in victim.placements:
            engine.state.release(placement)
        engine.release(victim.admission)
    rest = [r for r in running if r.workload_id not in {"b2", "b3"}]
    rest += apply(engine, plan.binds, 10.0)
    third = engine.plan([PendingWorkload("a2", one_gpu("a"), 20.0, queue="a")], 20.0, rng=rng, running=rest)
    assert not third.binds and not third.preempts


def test_strict_fifo_and_best_effort_fifo_apply_per_queue() -> None:
    big = Request(num_gpus=4, gpu_milli=1000, cpu_milli=1000)
    strict = QueueSpec("s", None, gpus(2), strategy="StrictFIFO")
    backfill = QueueSpec("f", None, gpus(2), strategy="BestEffortFIFO")
    engine = quota_scheduler(strict, backfill)
    pending = [
        PendingWorkload("s-big", big, 0.0, queue="s"),
        PendingWorkload("s-small", SMALL, 1.0, queue="s"),
        PendingWorkload("f-big", big, 0.0, queue="f"),
        PendingWorkload("f-small", SMALL, 1.0, queue="f"),
    ]
    plan = engine.plan(pending, rng=np.random.default_rng(0))
    assert [b.workload_id for b in plan.binds] == ["f-small"]
    assert plan.waiting["s-small"].startswith("behind workload s-big of queue s (StrictFIFO), which waits: ")


# ------------------------------------------------------------------------------------------ the implicit queue


def test_without_queues_binds_carry_no_admission_and_charge_is_a_no_op() -> None:
    engine = scheduler(QueueDiscipline.BEST_EFFORT_FIFO)
    plan = engine.plan(pending(), rng=np.random.default_rng(0))
    assert plan.binds and all(b.admission is None for b in plan.binds)
    assert engine.ledger is None and engine.charge(plan.binds[0]) is None


def test_without_queues_a_preemption_policy_preempts_by_priority_within_the_one_implicit_queue() -> None:
    state = ClusterState([NodeSpec("a", 32_000, 65_536, 2, "T4")])
    engine = Scheduler(Placer(state, make_policy("bestfit")), SchedulerConfig(preemption=PreemptionPolicy()))
    rng = np.random.default_rng(0)
    low = [PendingWorkload(f"low{i}", one_gpu("x"), float(i), priority=1, queue=f"q{i}") for i in range(2)]
    first = engine.plan(low, rng=rng)
    running = []
    for started_s, bind in enumerate(first.binds):
        for placement in bind.placements:
            state.bind(placement)
        admission = Admission("unused", "*", ResourceVector(), ResourceVector())  # ignored without queues
        running.append(RunningWorkload(bind.workload_id, "ignored", 1, bind.placements, admission, float(started_s)))
    high = PendingWorkload("high", one_gpu("y"), 5.0, priority=9)
    plan = engine.plan([high], 5.0, rng=rng, running=running)
    assert [p.workload_id for p in plan.preempts] == ["low1"]  # the youngest of the lower-priority ones
    assert [b.workload_id for b in plan.binds] == ["high"] and plan.binds[0].admission is None
    nothing = engine.plan([PendingWorkload("peer", one_gpu("y"), 6.0, priority=1)], 6.0, rng=rng, running=running)
    assert not nothing.binds and not nothing.preempts  # equal priority never preempts


# ------------------------------------------------------------------------------------------ reclaim in one step


def vec(gpu_milli: int) -> dict[str, ResourceVector]:
    return {"*": ResourceVector(gpu_milli, 64_000, 131_072)}


def test_reclaim_finds_victims_that_free_a_whole_gpu_when_the_cheapest_ones_do_not() -> None:
    # x (nominal 3.5 GPUs) runs 2 whole GPUs on node b; y (nominal 0.5) runs a half GPU of its own on (a, 0) and
    # borrows three halves: h1 on (a, 0), h2 and h3 on (a, 1). x's new whole-GPU job is owed 1 GPU of borrowed
    # quota: the cheapest pair (youngest: h1, h2) frees two halves of different GPUs, which fit nothing.
    engine = quota_scheduler(QueueSpec("x", "org", vec(3500)), QueueSpec("y", "org", vec(500)), preempt=True)
    assert engine.ledger is not None
    half = Request(num_gpus=1, gpu_milli=500, cpu_milli=1000, queue="y")
    layout = [
        ("x0", "x", one_gpu("x"), 1, 0, 1000, 0.0),
        ("x1", "x", one_gpu("x"), 1, 1, 1000, 0.0),
        ("keep", "y", half, 0, 0, 500, 0.0),
        ("h3", "y", half, 0, 1, 500, 10.0),
        ("h2", "y", half, 0, 1, 500, 30.0),
        ("h1", "y", half, 0, 0, 500, 40.0),
    ]
    running = []
    for wid, queue, request, node, gpu, milli, started_s in layout:
        placement = Placement(node, (gpu,), request, milli)
        engine.state.bind(placement)
        admission = engine.ledger.admit(queue, "*", ResourceVector(milli, 1000, 0))
        running.append(RunningWorkload(wid, queue, 0, (placement,), admission, started_s, checkpointed=True))
    assert [r.workload_id for r in running if r.admission.is_borrowing] == ["h3", "h2", "h1"]
    plan = engine.plan(
        [PendingWorkload("new", one_gpu("x"), 50.0, queue="x")], 50.0, rng=np.random.default_rng(0), running=running
    )
    assert sorted(p.workload_id for p in plan.preempts) == ["h2", "h3"]  # they free GPU (a, 1) whole
    assert [b.workload_id for b in plan.binds] == ["new"] and plan.binds[0].placements[0].gpu_indices == (1,)


def test_a_workload_that_cannot_be_preempted_is_never_admitted_by_borrowing() -> None:
    engine = quota_scheduler(QueueSpec("a", "org", gpus(2)), QueueSpec("b", "org", gpus(2)), preempt=True)
    pending = [PendingWorkload(f"b{i}", one_gpu("b"), float(i), queue="b", preemptible=False) for i in range(3)]
    plan = engine.plan(pending, rng=np.random.default_rng(0))
    assert [b.workload_id for b in plan.binds] == ["b0", "b1"]
    assert "quota" in plan.waiting["b2"]


def test_work_within_nominal_quota_goes_before_work_that_would_borrow_in_the_same_step() -> None:
    # The borrower's weight keeps its dominant share lowest, so DRF offers it every turn; without the two passes
    # its 3rd and 4th jobs would borrow the owner's idle quota before the owner's jobs are tried, in this very step.
    engine = quota_scheduler(QueueSpec("borrower", "org", gpus(2), weight=10.0), QueueSpec("owner", "org", gpus(2)))
    pending = [PendingWorkload(f"b{i}", one_gpu("borrower"), float(i), queue="borrower") for i in range(4)]
    pending += [PendingWorkload(f"o{i}", one_gpu("owner"), 9.0, queue="owner") for i in range(2)]
    plan = engine.plan(pending, rng=np.random.default_rng(0))
    assert sorted(b.workload_id for b in plan.binds) == ["b0", "b1", "o0", "o1"]
