"""Head reservation (EASY backfill, ``SchedulerConfig.head_reservation``): a BestEffortFIFO queue's blocked head
reserves the capacity it gets when running workloads end, and a backfilled workload never delays it."""

import dataclasses
from collections.abc import Sequence

import numpy as np
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from tessera.core.cluster import ClusterState, NodeSpec
from tessera.core.placement import Placer, make_policy
from tessera.core.preemption import PreemptionPolicy
from tessera.core.queueing import ResourceVector
from tessera.core.queueing.quotas import Admission
from tessera.core.scheduler import (
    Bind,
    PendingWorkload,
    QueueDiscipline,
    RunningWorkload,
    Scheduler,
    SchedulerConfig,
)
from tessera.core.workload import Placement, Request

T4 = frozenset({"T4"})
HEAD = Request(num_gpus=2, gpu_milli=1000, cpu_milli=1000, gpu_types=T4)
ONE_T4 = Request(num_gpus=1, gpu_milli=1000, cpu_milli=1000, gpu_types=T4)
ONE_ANY = Request(num_gpus=1, gpu_milli=1000, cpu_milli=1000)
_NO_CHARGE = Admission("default", "*", ResourceVector.zero(), ResourceVector.zero())


def engine(reservation: bool, discipline: QueueDiscipline = QueueDiscipline.BEST_EFFORT_FIFO) -> Scheduler:
    """Node a: 2 T4s; node b: 2 T4s; node c: 1 V100."""
    state = ClusterState(
        [
            NodeSpec("a", 32_000, 65_536, 2, "T4"),
            NodeSpec("b", 32_000, 65_536, 2, "T4"),
            NodeSpec("c", 32_000, 65_536, 1, "V100"),
        ]
    )
    config = SchedulerConfig(discipline=discipline, head_reservation=reservation)
    return Scheduler(Placer(state, make_policy("bestfit")), config)


def run(engine: Scheduler, workload_id: str, node: int, gpus: tuple[int, ...], end_s: float | None) -> RunningWorkload:
    """A workload running (bound on the state) on whole GPUs ``gpus`` of ``node``."""
    request = Request(num_gpus=len(gpus), gpu_milli=1000, cpu_milli=1000)
    placement = Placement(node, gpus, request, 1000)
    engine.state.bind(placement)
    return RunningWorkload(workload_id, "default", 0, (placement,), _NO_CHARGE, 0.0, expected_end_s=end_s)


def blocked_head_cluster(reservation: bool, a_end_s: float | None = 100.0) -> tuple[Scheduler, list[RunningWorkload]]:
    """The 2-GPU head does not fit now: a's GPU 0 runs until ``a_end_s``, b is busy until 1000 s; a's GPU 1 and
    c's V100 are free. The head's shadow time is 100 s, on a's two GPUs."""
    e = engine(reservation)
    return e, [run(e, "r-a", 0, (0,), a_end_s), run(e, "r-b", 1, (0, 1), 1000.0)]


def later_workloads() -> list[PendingWorkload]:
    return [
        PendingWorkload("head", HEAD, 0.0),
        PendingWorkload("small-elsewhere", ONE_ANY, 1.0),  # fits on c, away from the reservation
        PendingWorkload("long-small", ONE_T4, 2.0, expected_duration_s=500.0),  # would take a's GPU 1 past 100 s
        PendingWorkload("short", ONE_T4, 3.0, expected_duration_s=50.0),  # ends at 50 s, before the shadow time
    ]


def apply(e: Scheduler, binds: Sequence[Bind]) -> dict[str, tuple[Placement, ...]]:
    placed = {}
    for bind in binds:
        for placement in bind.placements:
            e.state.bind(placement)
        placed[bind.workload_id] = bind.placements
    return placed


def test_with_reservation_a_backfill_that_would_take_the_heads_gpu_is_refused_and_the_others_start() -> None:
    e, running = blocked_head_cluster(reservation=True)
    plan = e.plan(later_workloads(), 0.0, rng=np.random.default_rng(0), running=running)
    started = {b.workload_id: b for b in plan.binds}
    assert set(started) == {"small-elsewhere", "short"}
    assert {p.node for p in started["small-elsewhere"].placements} == {2}  # the V100, not a's reserved GPU
    assert [(p.node, p.gpu_indices) for p in started["short"].placements] == [(0, (1,))]
    assert plan.waiting["long-small"] == "capacity reserved for head (expected to start at 100 s)"
    assert "2 free GPUs" in plan.waiting["head"]


def test_with_reservation_the_head_starts_at_its_shadow_time_after_the_backfills() -> None:
    e, running = blocked_head_cluster(reservation=True)
    rng = np.random.default_rng(0)
    placed = apply(e, e.plan(later_workloads(), 0.0, rng=rng, running=running).binds)
    for placement in placed["short"] + running[0].placements:  # short ends at 50 s, r-a at 100 s
        e.state.release(placement)
    plan = e.plan([PendingWorkload("head", HEAD, 0.0)], 100.0, rng=rng, running=[running[1]])
    assert [b.workload_id for b in plan.binds] == ["head"]


def test_without_reservation_the_same_backfill_delays_the_head() -> None:
    e, running = blocked_head_cluster(reservation=False)
    rng = np.random.default_rng(0)
    plan = e.plan(later_workloads(), 0.0, rng=rng, running=running)
    placed = apply(e, plan.binds)
    assert "head" not in placed
    t4_taker = next(w for w, ps in placed.items() if ps[0].node == 0)
    assert t4_taker != "short"  # best fit put a workload that runs past 100 s on a's GPU 1
    e.state.release(running[0].placements[0])  # r-a ends at 100 s
    assert not e.plan([PendingWorkload("head", HEAD, 0.0)], 100.0, rng=rng, running=[running[1]]).binds


def test_a_backfill_does_not_preempt_a_workload_whose_capacity_the_head_counts_on() -> None:
    state = ClusterState([NodeSpec("a", 32_000, 65_536, 2, "T4"), NodeSpec("b", 32_000, 65_536, 2, "T4")])
    config = SchedulerConfig(preemption=PreemptionPolicy(), head_reservation=True)
    e = Scheduler(Placer(state, make_policy("bestfit")), config)
    running = [
        dataclasses.replace(run(e, "r-a0", 0, (0,), 100.0), preemptible=False),
        run(e, "r-a1", 0, (1,), 50.0),  # preemptible, priority 0, ends before the head's shadow time (100 s)
        dataclasses.replace(run(e, "r-b", 1, (0, 1), 1000.0), preemptible=False),
    ]
    pending = [
        PendingWorkload("head", HEAD, 0.0, priority=5),  # preempting r-a1 alone would not make room
        PendingWorkload("long-small", ONE_T4, 1.0, priority=3, expected_duration_s=500.0),
    ]
    plan = e.plan(pending, 0.0, rng=np.random.default_rng(0), running=running)
    assert not plan.binds and not plan.preempts
    assert plan.waiting["long-small"] == "capacity reserved for head (expected to start at 100 s)"
    off = Scheduler(Placer(state, make_policy("bestfit")), dataclasses.replace(config, head_reservation=False))
    plan_off = off.plan(pending, 0.0, rng=np.random.default_rng(0), running=running)
    assert [p.workload_id for p in plan_off.preempts] == ["r-a1"]  # without it, the backfill takes a's GPU 1
    assert [b.workload_id for b in plan_off.binds] == ["long-small"]


def test_unknown_ends_keep_todays_backfill() -> None:
    on, running_on = blocked_head_cluster(reservation=True, a_end_s=None)
    off, running_off = blocked_head_cluster(reservation=False, a_end_s=None)
    # r-a's end is unknown and b (known end) alone cannot hold the head beside r-a: no shadow time, no reservation
    plan_on = on.plan(later_workloads(), 0.0, rng=np.random.default_rng(0), running=running_on)
    plan_off = off.plan(later_workloads(), 0.0, rng=np.random.default_rng(0), running=running_off)
    assert plan_on == plan_off


def test_strict_fifo_is_unchanged_by_head_reservation() -> None:
    plans = []
    for reservation in (False, True):
        e = engine(reservation, QueueDiscipline.STRICT_FIFO)
        running = [run(e, "r-a", 0, (0,), 100.0), run(e, "r-b", 1, (0, 1), 1000.0)]
        plans.append(e.plan(later_workloads(), 0.0, rng=np.random.default_rng(0), running=running))
    assert plans[0] == plans[1] and not plans[0].binds


def test_the_plan_leaves_the_state_untouched() -> None:
    e, running = blocked_head_cluster(reservation=True)
    before = (e.state.gpu_free_milli.copy(), e.state.cpu_free_milli.copy(), e.state.mem_free_mib.copy())
    e.plan(later_workloads(), 0.0, rng=np.random.default_rng(0), running=running)
    after = (e.state.gpu_free_milli, e.state.cpu_free_milli, e.state.mem_free_mib)
    assert all(np.array_equal(x, y) for x, y in zip(before, after, strict=True))


# ------------------------------------------------------------------------------------------ random clusters


@settings(max_examples=60, deadline=None)
@given(
    # Running: GPUs, end. At least three workloads of 2+ GPUs on 12 GPUs, so the head is nearly always blocked.
    st.lists(st.tuples(st.integers(2, 4), st.integers(1, 20)), min_size=3, max_size=10),
    st.integers(2, 4),  # head GPUs
    st.lists(st.tuples(st.integers(1, 3), st.one_of(st.none(), st.integers(1, 25))), max_size=8),  # later
)
def test_a_backfilled_workload_never_delays_the_head(
    running_shapes: list[tuple[int, int]], head_gpus: int, later: list[tuple[int, int | None]]
) -> None:
    """Whatever starts beside a blocked head, the head still fits when the running workloads that end by its
    shadow time (the earliest time it fits without them) and the backfills that end by then are gone."""
    state = ClusterState([NodeSpec(f"n{k}", 64_000, 131_072, 4, "T4") for k in range(3)])
    e = Scheduler(Placer(state, make_policy("bestfit")), SchedulerConfig(head_reservation=True))
    rng = np.random.default_rng(0)
    running: list[RunningWorkload] = []
    for k, (count, end) in enumerate(running_shapes):
        request = Request(num_gpus=count, gpu_milli=1000, cpu_milli=1000)
        plan = e.plan([PendingWorkload(f"r{k}", request, 0.0)], rng=rng)
        for bind in plan.binds:
            apply(e, (bind,))
            running.append(
                RunningWorkload(f"r{k}", "default", 0, bind.placements, _NO_CHARGE, 0.0, expected_end_s=float(end))
            )
    head = PendingWorkload("head", Request(num_gpus=head_gpus, gpu_milli=1000, cpu_milli=1000), 0.0)
    assume(not e.plan([head], rng=rng).binds)  # the property is about a blocked head
    shadow = _shadow(e, head, running)
    assume(shadow is not None)  # some known end lets the head fit: a reservation is made
    assert shadow is not None  # (for mypy: assume() does not narrow)
    pending = [head] + [
        PendingWorkload(f"w{k}", Request(num_gpus=g, gpu_milli=1000, cpu_milli=1000), 1.0 + k, expected_duration_s=d)
        for k, (g, d) in enumerate(later)
    ]
    placed = apply(e, e.plan(pending, 0.0, rng=rng, running=running).binds)
    assert "head" not in placed
    durations = {w.workload_id: w.expected_duration_s for w in pending}
    for r in running:
        if r.expected_end_s is not None and r.expected_end_s <= shadow:
            for p in r.placements:
                e.state.release(p)
    for workload_id, placements in placed.items():
        duration = durations[workload_id]
        if duration is not None and duration <= shadow:
            for p in placements:
                e.state.release(p)
    assert e.plan([head], rng=rng).binds, f"head delayed past {shadow} s by {sorted(placed)}"


def _shadow(e: Scheduler, head: PendingWorkload, running: list[RunningWorkload]) -> float | None:
    """The earliest known end after which the head fits (state restored)."""
    released: list[Placement] = []
    found = None
    try:
        for r in sorted(running, key=lambda r: r.expected_end_s or 0.0):
            for p in r.placements:
                e.state.release(p)
                released.append(p)
            if e.plan([head], rng=np.random.default_rng(0)).binds:
                found = r.expected_end_s
                break
    finally:
        for p in reversed(released):
            e.state.bind(p)
    return found


def test_pending_and_running_workloads_default_to_unknown_times() -> None:
    w = PendingWorkload("w", ONE_ANY, 0.0)
    r = RunningWorkload("r", "default", 0, (), _NO_CHARGE, 0.0)
    assert w.expected_duration_s is None and r.expected_end_s is None
    assert not SchedulerConfig().head_reservation
    assert dataclasses.replace(w, expected_duration_s=3.0).expected_duration_s == 3.0
