"""Under LAS within classes (preset ``tessera``) every run is guarded for its first minimum run time, against LAS
churn within its priority class; a strictly higher class is not held back by that guard (``PreemptionGuard.
class_spread``, set by ``queueing.las.class_guard``), except for a run bound in the same instant, and never loops."""

from __future__ import annotations

import pytest

from tessera.core.cluster import ClusterState, NodeSpec
from tessera.core.errors import InvalidRequestError
from tessera.core.pending import PendingOffer, schedule_instant
from tessera.core.preemption import Candidate, PreemptionGuard, priority_class, select_victims
from tessera.core.presets import PREEMPTION_MIN_RUNTIME_S, build_scheduler, resolve_preset
from tessera.core.queueing.las import LAS_CLASS_SPREAD, TIRESIAS_THRESHOLDS_GPU_S, LasService
from tessera.core.queueing.quotas import QuotaNeed
from tessera.core.queueing.resources import ResourceVector
from tessera.core.scheduler import Bind, PendingWorkload, Preempt, Scheduler, StepPlan
from tessera.core.workload import Request

NODE = [NodeSpec("n", 32_000, 65_536, 1, "A100-80GB")]
SHARES = [Request(num_gpus=1, gpu_milli=600), Request(num_gpus=1, gpu_milli=1000)]  # never two on the GPU
TRAINING, INFERENCE = 500, 1000  # the built-in classes' priorities


def tessera(policy: str = "tessera") -> Scheduler:
    return build_scheduler(resolve_preset(policy), ClusterState(NODE))


def training(workload_id: str, request: Request, at_s: float) -> PendingWorkload:
    return PendingWorkload(workload_id, request, at_s, TRAINING, preemptible=True, checkpointed=True)


def critical(workload_id: str, request: Request, at_s: float) -> PendingWorkload:
    return PendingWorkload(workload_id, request, at_s, INFERENCE, preemptible=False)


@pytest.mark.parametrize("request_", SHARES, ids=["fraction", "whole-gpu"])
def test_a_higher_class_preempts_a_run_that_just_started(request_: Request) -> None:
    engine = tessera()
    engine.commit(engine.plan([training("t", request_, 0.0)], 0.0), 0.0)
    assert "t" in engine.books.guard.preempted  # every run is guarded under LAS
    plan = engine.plan([critical("i", request_, 1.0)], 1.0)  # one second into the training run
    assert [p.workload_id for p in plan.preempts] == ["t"]  # before: none until 600 s
    assert [b.workload_id for b in plan.binds] == ["i"]


@pytest.mark.parametrize("request_", SHARES, ids=["fraction", "whole-gpu"])
def test_the_guard_still_holds_back_a_lower_las_level_of_the_same_class(request_: Request) -> None:
    """A training run that restarted with two GPU-hours of service (LAS level 1) is not preempted by a new training
    workload (level 0) before its minimum run time, and is after it."""
    engine = tessera()
    engine.commit(engine.plan([training("old", request_, 0.0)], 0.0), 0.0)
    two_hours = 2 * TIRESIAS_THRESHOLDS_GPU_S[0] * 1000 / request_.gpu_milli
    engine.observe(["old"], two_hours, finished=False)
    engine.commit(engine.plan([training("old", request_, 0.0)], two_hours), two_hours)
    new = training("new", request_, two_hours)
    assert engine.effective(new, two_hours).priority > engine.books.candidates(two_hours + 1)[0].priority
    assert not engine.plan([new], two_hours + 1).preempts
    later = two_hours + PREEMPTION_MIN_RUNTIME_S + 1
    assert [p.workload_id for p in engine.plan([new], later).preempts] == ["old"]


def test_plain_las_keeps_guarding_every_run() -> None:
    """tiresias has no classes (its priority is the LAS level): its guard is unchanged."""
    engine = tessera("tiresias")
    engine.commit(engine.plan([training("t", SHARES[1], 0.0)], 0.0), 0.0)
    assert not engine.plan([critical("i", SHARES[1], 1.0)], 1.0).preempts


def test_a_run_bound_in_this_instant_is_never_a_victim_of_priority() -> None:
    """An earlier step of the instant bound it (the runtime has not launched it: the server once failed here); the
    higher class preempts it from the next instant on."""
    engine = tessera()
    engine.commit(engine.plan([training("t", SHARES[1], 5.0)], 5.0), 5.0)
    assert not engine.plan([critical("i", SHARES[1], 5.0)], 5.0).preempts
    assert [p.workload_id for p in engine.plan([critical("i", SHARES[1], 5.0)], 5.001).preempts] == ["t"]
    fresh = Candidate("t", "q", TRAINING * LAS_CLASS_SPREAD, True, 5.0, True, ResourceVector(gpu_milli=1000), False)
    guard = PreemptionGuard(600.0, frozenset({"t"}), class_spread=LAS_CLASS_SPREAD)
    need = QuotaNeed(ResourceVector.zero(), ResourceVector.zero(), None)
    one_gpu, preemptor = ResourceVector(gpu_milli=1000), INFERENCE * LAS_CLASS_SPREAD
    assert select_victims("q", preemptor, one_gpu, [fresh], 5.0, quota=need, guard=guard) is None
    assert select_victims("q", preemptor, one_gpu, [fresh], 5.5, quota=need, guard=guard) == ["t"]


def test_the_guard_exemption_needs_a_strictly_higher_class() -> None:
    guard = PreemptionGuard(600.0, frozenset({"v"}), class_spread=LAS_CLASS_SPREAD)
    victim = Candidate("v", "q", TRAINING * LAS_CLASS_SPREAD - 1, True, 0.0, True, ResourceVector.zero(), False)
    assert guard.protects(victim, 1.0, TRAINING * LAS_CLASS_SPREAD)  # same class, higher LAS level: guarded
    assert not guard.protects(victim, 1.0, INFERENCE * LAS_CLASS_SPREAD - 2)  # higher class, any level
    assert guard.protects(victim, 1.0)  # preemptor unknown: guarded
    assert PreemptionGuard(600.0, frozenset({"v"})).protects(victim, 1.0, INFERENCE * LAS_CLASS_SPREAD)
    assert guard.record(["w"]).class_spread == LAS_CLASS_SPREAD == guard.forget(["v"]).class_spread
    with pytest.raises(InvalidRequestError, match="class_spread"):
        PreemptionGuard(class_spread=0)


def _instant(engine: Scheduler, offer: PendingOffer, now_s: float, pending: dict[str, PendingWorkload]) -> StepPlan:
    """Every step of one instant, as the runtimes schedule it; the decisions of all its steps, merged."""
    binds: list[Bind] = []
    preempts: list[Preempt] = []

    def apply(plan: StepPlan) -> None:
        engine.commit(plan, now_s)
        for bind in plan.binds:
            offer.remove(bind.workload_id)
        for preempt in plan.preempts:
            offer.released()
            offer.add(preempt.workload_id)  # requeued at once, as the simulator does
        binds.extend(plan.binds)
        preempts.extend(plan.preempts)

    schedule_instant(engine, offer, now_s, lambda w: pending[w], apply, False)
    return StepPlan(binds=tuple(binds), preempts=tuple(preempts))


@pytest.mark.parametrize("request_", SHARES, ids=["fraction", "whole-gpu"])
def test_an_evicted_replica_that_comes_back_never_evicts_the_winner(request_: Request) -> None:
    """The no-loop promise, over an hour stepped every second: the low-priority service is evicted once by the
    high-priority one, then waits (guards expired or not, LAS levels dropping) without preempting anything, and runs
    again once the winner ends; nothing is ever preempted twice."""
    engine = tessera()
    pending = {
        "low": PendingWorkload("low", request_, 0.0, TRAINING, preemptible=True, checkpointed=True),
        "high": critical("high", request_, 100.0),
    }
    offer = PendingOffer(False, lambda w: (pending[w].request, 1, pending[w].priority, "q", True, None), lambda w: "q")
    offer.add("low")
    decided: list[tuple[float, str, str]] = []
    for second in range(0, 3_601):
        now = float(second)
        if second == 100:
            offer.add("high")
        if second == 3_000:  # the winner ends
            engine.observe(["high"], now)
            offer.released()
        plan = _instant(engine, offer, now, pending)
        decided += [(now, "preempt", p.workload_id) for p in plan.preempts]
        decided += [(now, "bind", b.workload_id) for b in plan.binds]
    assert decided == [
        (0.0, "bind", "low"),
        (100.0, "preempt", "low"),
        (100.0, "bind", "high"),
        (3_000.0, "bind", "low"),
    ]


def test_a_victim_is_offered_again_only_from_the_next_instant() -> None:
    """The server requeues a victim once its process exited, after the tick that stopped it; the offer holds it for
    the rest of the instant in every runtime, so that the simulator does not bind it earlier than the server."""
    shapes = {"a": 1, "b": 1, "c": 2}
    offer = PendingOffer(False, lambda w: (SHARES[0], 1, shapes[w], "q", True, None), lambda w: "q")
    for w in ("a", "b", "c"):
        offer.add(w)
    offer.instant(1.0)
    offer.hold(["a"], 1.0)
    assert offer.candidates() == ["b", "c"]  # "b" stands first for the shape of "a" and "b"
    offer.hold(["c"], 1.0)
    assert offer.candidates() == ["b"]
    offer.instant(2.0)
    assert offer.candidates() == ["a", "c"]


def test_a_plan_holds_its_victims_for_the_instant() -> None:
    engine = tessera()
    pending = {"t": training("t", SHARES[1], 0.0), "i": critical("i", SHARES[1], 1.0)}
    offer = PendingOffer(False, lambda w: (pending[w].request, 1, pending[w].priority, "q", True, None), lambda w: "q")
    offer.add("t")
    _instant(engine, offer, 0.0, pending)
    offer.add("i")
    plan = _instant(engine, offer, 1.0, pending)
    assert [p.workload_id for p in plan.preempts] == ["t"] and "t" in offer.held
    assert offer.candidates() == []  # the victim waits for the next instant, even with room released


@pytest.mark.parametrize("base", [-3, 0, 100, TRAINING, INFERENCE])
def test_priority_class_is_the_class_under_every_level(base: int) -> None:
    las = LasService(TIRESIAS_THRESHOLDS_GPU_S, within_class=True)
    for attained in (0.0, TIRESIAS_THRESHOLDS_GPU_S[0], TIRESIAS_THRESHOLDS_GPU_S[1]):
        las.attained_gpu_s["w"] = attained
        for preemptible in (True, False):
            priority = las.priority("w", 0.0, 0.0, base, preemptible)
            assert priority_class(priority, LAS_CLASS_SPREAD) == base


def test_las_within_classes_rejects_more_levels_than_a_class_spans() -> None:
    too_many = tuple(float(t) for t in range(1, LAS_CLASS_SPREAD + 1))
    with pytest.raises(InvalidRequestError, match="las_thresholds_gpu_s"):
        LasService(too_many, within_class=True)
    LasService(too_many, within_class=False)  # plain LAS has no classes to keep apart
