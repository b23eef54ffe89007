"""Under LAS within classes (preset ``tessera``) every run is guarded for its first minimum run time, against LAS
churn within its priority class; a strictly higher class is not held back by that guard (``QuotaStep._guard_for``)."""

from __future__ import annotations

import pytest

from tessera.core.cluster import ClusterState, NodeSpec
from tessera.core.errors import InvalidRequestError
from tessera.core.presets import PREEMPTION_MIN_RUNTIME_S, build_scheduler, resolve_preset
from tessera.core.queueing.las import LAS_CLASS_SPREAD, TIRESIAS_THRESHOLDS_GPU_S, LasService, las_class
from tessera.core.scheduler import PendingWorkload, Scheduler
from tessera.core.workload import Request

NODE = [NodeSpec("n", 32_000, 65_536, 1, "A100-80GB")]
SHARES = [Request(num_gpus=1, gpu_milli=600), Request(num_gpus=1, gpu_milli=1000)]  # never two on the GPU
TRAINING, INFERENCE = 500, 1000  # the built-in classes' priorities


def tessera(policy: str = "tessera") -> Scheduler:
    return build_scheduler(resolve_preset(policy), ClusterState(NODE))


def training(workload_id: str, request: Request, at_s: float) -> PendingWorkload:
    return PendingWorkload(workload_id, request, at_s, TRAINING, preemptible=True, checkpointed=True)


@pytest.mark.parametrize("request_", SHARES, ids=["fraction", "whole-gpu"])
def test_a_higher_class_preempts_a_run_that_just_started(request_: Request) -> None:
    engine = tessera()
    engine.commit(engine.plan([training("t", request_, 0.0)], 0.0), 0.0)
    assert "t" in engine.books.guard.preempted  # every run is guarded under LAS
    critical = PendingWorkload("i", request_, 1.0, INFERENCE, preemptible=False)
    plan = engine.plan([critical], 1.0)  # one second into the training run
    assert [p.workload_id for p in plan.preempts] == ["t"]  # before the fix: none until 600 s
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
    critical = PendingWorkload("i", SHARES[1], 1.0, INFERENCE, preemptible=False)
    assert not engine.plan([critical], 1.0).preempts


@pytest.mark.parametrize("base", [-3, 0, 100, TRAINING, INFERENCE])
def test_las_class_is_the_class_under_every_level(base: int) -> None:
    las = LasService(TIRESIAS_THRESHOLDS_GPU_S, within_class=True)
    las.attained_gpu_s["w"] = 0.0
    for attained in (0.0, TIRESIAS_THRESHOLDS_GPU_S[0], TIRESIAS_THRESHOLDS_GPU_S[1]):
        las.attained_gpu_s["w"] = attained
        for preemptible in (True, False):
            assert las_class(las.priority("w", 0.0, 0.0, base, preemptible)) == base


def test_las_within_classes_rejects_more_levels_than_a_class_spans() -> None:
    too_many = tuple(float(t) for t in range(1, LAS_CLASS_SPREAD + 1))
    with pytest.raises(InvalidRequestError, match="las_thresholds_gpu_s"):
        LasService(too_many, within_class=True)
    LasService(too_many, within_class=False)  # plain LAS has no classes to keep apart
