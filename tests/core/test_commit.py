"""The scheduler owns the books: ``commit`` applies a plan in one place, ``observe`` returns what ended workloads held,
``adopt`` takes running workloads back after a restart, and a step's tentative changes are undone by its trial."""

from __future__ import annotations

import numpy as np
import pytest

from tessera.core.cluster import ClusterState, NodeSpec
from tessera.core.decisions import Decision
from tessera.core.invariants import check_charges, check_cluster, check_quotas
from tessera.core.pending import PendingOffer, Shape
from tessera.core.placement import Placer, make_policy
from tessera.core.preemption import PreemptionPolicy
from tessera.core.presets import PRESET_NAMES, build_scheduler, resolve_preset
from tessera.core.queueing import QueueSpec, QuotaLedger, ResourceVector
from tessera.core.queueing.las import TIRESIAS_THRESHOLDS_GPU_S
from tessera.core.scheduler import PendingWorkload, Preempt, RunningWorkload, Scheduler, SchedulerConfig
from tessera.core.trial import Trial
from tessera.core.workload import Placement, Request

NODES = [NodeSpec("a", 32_000, 65_536, 2, "T4"), NodeSpec("b", 32_000, 65_536, 2, "T4")]
ONE = Request(num_gpus=1, gpu_milli=1000, cpu_milli=1000)
HALF = Request(num_gpus=1, gpu_milli=500, cpu_milli=1000)


def queues(preempt: bool = True) -> Scheduler:
    quota = {"*": ResourceVector(2000, 64_000, 131_072)}
    specs = (QueueSpec("x", "org", quota), QueueSpec("y", "org", quota))
    config = SchedulerConfig(queues=specs, preemption=PreemptionPolicy() if preempt else None)
    return Scheduler(Placer(ClusterState(NODES), make_policy("bestfit")), config)


def check(engine: Scheduler) -> None:
    books = engine.books
    check_cluster(books.state, list(books.placements()))
    if books.ledger is not None:
        check_quotas(books.ledger)
        check_charges(books.ledger, [r for w, r in books.running.items() if w not in books.uncharged])


def test_commit_applies_binds_and_observe_gives_everything_back() -> None:
    engine = queues()
    free = engine.state.gpu_free_milli.copy()
    plan = engine.plan([PendingWorkload(f"w{i}", ONE, float(i), queue="x") for i in range(3)], 0.0)
    assert np.array_equal(engine.state.gpu_free_milli, free)  # planning changes nothing
    engine.commit(plan, 0.0)
    check(engine)
    assert sorted(engine.books.running) == ["w0", "w1", "w2"]
    assert engine.ledger is not None and engine.ledger.usage("x", "*").gpu_milli == 3000  # one GPU borrowed
    assert int(free.sum() - engine.state.gpu_free_milli.sum()) == 3000
    engine.observe(["w0", "w1", "w2"], 10.0)
    check(engine)
    assert not engine.books.running and np.array_equal(engine.state.gpu_free_milli, free)
    assert engine.ledger.usage("x", "*").gpu_milli == 0


def test_commit_applies_a_reclaim_and_the_guard_protects_the_victims_next_run() -> None:
    engine = queues()
    engine.commit(engine.plan([PendingWorkload(f"x{i}", ONE, float(i), queue="x") for i in range(4)], 0.0), 0.0)
    plan = engine.plan([PendingWorkload("y0", ONE, 5.0, queue="y")], 5.0)
    assert [p.workload_id for p in plan.preempts] and [b.workload_id for b in plan.binds] == ["y0"]
    engine.journal = []
    engine.commit(plan, 5.0)
    check(engine)
    victim = plan.preempts[0].workload_id
    assert victim not in engine.books.running and victim in engine.books.guard.preempted
    kinds = [type(a.decision).__name__ for a in engine.journal]
    assert kinds == ["Preempt", "Bind"] and all(a.admission is not None for a in engine.journal)
    engine.observe([victim], 6.0, finished=False)  # a restart keeps the guard
    assert victim in engine.books.guard.preempted
    engine.observe([victim], 7.0)
    assert victim not in engine.books.guard.preempted


def test_restore_puts_a_preempted_victim_back_with_its_quota_and_its_las_service() -> None:
    """A preemption the runtime could not carry out (its decisions were not stored) is undone: the victim holds its
    placements and quota again, and its LAS service is what it was (``preempt`` counted it up to then)."""
    engine = queues()
    engine.commit(engine.plan([PendingWorkload(f"x{i}", ONE, float(i), queue="x") for i in range(4)], 0.0), 0.0)
    before = dict(engine.books.running)
    free = engine.state.gpu_free_milli.copy()
    plan = engine.plan([PendingWorkload("y0", ONE, 5.0, queue="y")], 5.0)
    victims: dict[str, RunningWorkload] = {}

    def applied(decision: Decision, entry: RunningWorkload) -> None:
        if isinstance(decision, Preempt):
            victims[decision.workload_id] = entry

    engine.commit(plan, 5.0, applied)
    assert victims
    engine.observe(["y0"], 5.0, finished=False)
    for wid, entry in victims.items():
        assert engine.restore(entry, PendingWorkload(wid, ONE, 0.0, queue="x"), 5.0)
    check(engine)
    assert engine.books.running == before and np.array_equal(engine.state.gpu_free_milli, free)

    las_engine = build_scheduler(resolve_preset("tiresias"), ClusterState(NODES))
    job = PendingWorkload("j", ONE, 0.0, checkpointed=True)
    las_engine.commit(las_engine.plan([job], 0.0), 0.0)
    las = las_engine.books.las
    assert las is not None
    victim = las_engine.books.preempt(Preempt("j", "priority", "k"), 100.0)
    assert las.attained_gpu_s["j"] == 100.0
    assert las_engine.restore(victim, job, 100.0)
    assert las.attained_gpu_s["j"] + (250.0 - las.run_started["j"]) == 250.0  # served from 0 to 250 on one GPU
    assert las_engine.books.running["j"].started_s == 0.0  # its run's start stays (the runtime's rechecks)


def test_a_bind_needs_the_workload_it_was_planned_for() -> None:
    engine = queues()
    plan = engine.plan([PendingWorkload("w", ONE, 0.0, queue="x")], 0.0)
    bare = type(plan)(binds=tuple(type(b)(b.workload_id, b.placements, b.admission) for b in plan.binds))
    with pytest.raises(ValueError, match="names no pending workload"):
        engine.commit(bare, 0.0)


def test_adopt_rebinds_a_running_workload_and_refuses_one_that_no_longer_fits() -> None:
    engine = queues()
    first = engine.plan([PendingWorkload("w", ONE, 0.0, queue="x")], 0.0).binds[0]
    assert first.admission is not None and first.workload is not None
    fresh = queues()
    assert fresh.adopt(first.workload, first.placements, first.admission, 0.0)
    check(fresh)
    free = fresh.state.gpu_free_milli.copy()
    clash = Placement(first.placements[0].node, first.placements[0].gpu_indices, ONE, 1000)
    assert not fresh.adopt(PendingWorkload("v", ONE, 0.0, queue="x"), (clash,), None, 0.0)
    assert np.array_equal(fresh.state.gpu_free_milli, free) and "v" not in fresh.books.running


def test_a_quota_cut_keeps_running_workloads_uncharged() -> None:
    engine = queues()
    engine.commit(engine.plan([PendingWorkload(f"x{i}", ONE, float(i), queue="x") for i in range(3)], 0.0), 0.0)
    small = {"*": ResourceVector(1000, 64_000, 131_072)}
    engine.reconfigure(SchedulerConfig(queues=(QueueSpec("x", None, small),)))
    assert len(engine.books.uncharged) == 2 and engine.ledger is not None
    assert engine.ledger.usage("x", "*").gpu_milli == 1000
    assert {c.workload_id for c in engine.books.candidates(1.0)} == set(engine.books.running) - engine.books.uncharged
    engine.observe(list(engine.books.running), 2.0)
    assert engine.ledger.usage("x", "*").gpu_milli == 0 and not engine.books.uncharged


def test_las_priorities_drop_with_attained_service_and_every_run_is_guarded() -> None:
    state = ClusterState(NODES)
    engine = build_scheduler(resolve_preset("tiresias"), state)
    job = PendingWorkload("j", ONE, 0.0, checkpointed=True)
    assert engine.effective(job, 0.0).priority == 0
    engine.commit(engine.plan([job], 0.0), 0.0)
    assert "j" in engine.books.guard.preempted  # protected for its first minimum run time
    hour = TIRESIAS_THRESHOLDS_GPU_S[0]
    (running,) = engine.books.candidates(hour + 1)
    assert running.priority == -1  # one GPU for more than an hour: the second LAS queue
    engine.observe(["j"], 2 * hour)
    assert engine.effective(job, 3 * hour).priority == -1  # the service is remembered for its next run


@pytest.mark.parametrize("name", PRESET_NAMES)
def test_every_preset_builds_a_scheduler_that_places_and_commits(name: str) -> None:
    preset = resolve_preset(name)
    engine = build_scheduler(preset, ClusterState(NODES))
    request = preset.request_of(HALF)  # the runtime hands the scheduler the request as the preset places it
    pending = [PendingWorkload(f"w{i}", request, float(i), preemptible=True) for i in range(5)]
    engine.commit(engine.plan(pending, 0.0), 0.0)
    check(engine)
    shares = {p.gpu_milli_each for p in engine.books.placements()}
    assert shares == ({1000} if preset.whole_gpus else {500})  # static binding rounds up


def test_the_offer_retries_a_failed_shape_only_after_a_release() -> None:
    shapes: dict[str, Shape] = {w: (HALF, 1, 0, "q", True, None) for w in ("a", "b")}
    shapes["c"] = (ONE, 1, 0, "q", True, None)
    offer = PendingOffer(False, shapes.__getitem__, lambda w: "q")
    for w in "abc":
        offer.add(w)
    assert offer.candidates() == ["a", "c"]  # the first of each shape
    offer.failed("a", "no room")
    assert offer.candidates() == ["c"]
    behind = "behind workload a (same queue and request), which waits: no room"
    assert offer.reasons({"a": "no room"}) == {"a": "no room", "b": behind}
    offer.released()
    assert offer.candidates() == ["a", "c"]
    offer.remove("a")
    assert offer.candidates() == ["b", "c"]


@pytest.mark.parametrize("strict_fifo", [False, True])
def test_workloads_put_back_wait_at_the_head_of_their_line_in_their_order(strict_fifo: bool) -> None:
    shapes: dict[str, Shape] = {w: (HALF, 1, 0, "q", True, None) for w in "abcd"}
    offer = PendingOffer(strict_fifo, shapes.__getitem__, lambda w: "q")
    for w in "abcd":
        offer.add(w)
    offer.remove("a")
    offer.remove("b")
    offer.put_back(["a", "b"])  # their binds were undone
    line = offer.fifo["q"] if strict_fifo else offer.groups[shapes["a"]]
    assert list(line) == ["a", "b", "c", "d"]
    assert offer.candidates()[0] == "a"


def test_a_workload_added_behind_a_shape_no_step_offers_is_told_what_it_waits_for() -> None:
    """Issue 25: a workload submitted behind a quota-blocked one of the same shape was never offered (the shape
    failed since the last release) and kept "waiting for the next scheduling step"."""
    shapes: dict[str, Shape] = {w: (HALF, 1, 0, "q", True, None) for w in ("a", "b", "c")}
    offer = PendingOffer(False, shapes.__getitem__, lambda w: "q")
    offer.add("a")
    offer.failed("a", "queue q has no quota left for 0.5 GPU")
    offer.reasons({"a": "queue q has no quota left for 0.5 GPU"})
    assert offer.unexplained() == {}
    offer.add("b")
    assert offer.candidates() == []  # no step is offered its shape before the next release
    why = "behind workload a (same queue and request), which waits: queue q has no quota left for 0.5 GPU"
    assert offer.unexplained() == {"b": why}
    assert offer.unexplained() == {}  # told once
    offer.remove("a")
    offer.remove("b")
    offer.add("c")  # first of its shape, which failed since the last release: it waits for the same
    assert offer.unexplained() == {"c": "queue q has no quota left for 0.5 GPU"}


def test_a_trial_rolls_back_to_a_mark_and_restores_the_ledger() -> None:
    state = ClusterState(NODES)
    ledger = QuotaLedger([QueueSpec("q", None, {"*": ResourceVector(4000, 64_000, 131_072)})])
    trial = Trial(state, ledger)
    free, versions = state.gpu_free_milli.copy(), state.version.copy()
    trial.bind(Placement(0, (0,), ONE, 1000))
    mark = trial.mark(with_ledger=True)
    trial.ledger.admit("q", "*", ResourceVector(1000, 0, 0))
    trial.bind(Placement(1, (1,), HALF, 500))
    trial.release(Placement(0, (0,), ONE, 1000))
    trial.rollback(mark)
    assert int(state.gpu_free_milli[0, 0]) == 0 and int(state.gpu_free_milli[1, 1]) == 1000
    assert trial.ledger.usage("q", "*").gpu_milli == 0
    trial.rollback()
    assert np.array_equal(state.gpu_free_milli, free)
    assert (state.version[:2] > versions[:2]).all()  # every change and its undo is seen by the placement caches
