"""Physics the replay applies under every policy: a checkpointed job resumes with the work it has left (at the
speed of the GPU model it restarts on), and training jobs sharing a GPU slow each other as the co-location model
says; tessera lets a pair share only when that is a net gain."""

import dataclasses

import pytest

from tessera.core.cluster import NodeSpec
from tessera.core.throughput import ColocationModel, ThroughputModel
from tessera.core.workload import Request
from tessera.sim.replay.timeline import run_timeline
from tessera.sim.workloads.jobs import TimelineJob

WHOLE = Request(num_gpus=1, gpu_milli=1000, cpu_milli=1000)
HALF = Request(num_gpus=1, gpu_milli=500, cpu_milli=1000)


def test_a_checkpointed_job_resumes_with_its_remaining_work_at_the_new_gpu_models_speed() -> None:
    nodes = [NodeSpec("a-v100", 16_000, 65_536, 1, "V100M16"), NodeSpec("b-t4", 16_000, 65_536, 1, "T4")]
    model = ThroughputModel({("x", "V100M16"): 4.0, ("x", "T4"): 1.0})
    t4_only = dataclasses.replace(WHOLE, gpu_types=frozenset({"T4"}))
    jobs = [
        TimelineJob("blocker", 0.0, t4_only, 4_050.0),  # holds the T4 until 4,050 s
        TimelineJob("long", 1.0, WHOLE, None, "x", 40_000.0, preemptible=True, checkpointed=True),  # 10,000 s on V100
        TimelineJob("short", 4_001.0, WHOLE, None, "x", 400.0),  # preempts "long" (a lower LAS queue by then)
    ]
    result = run_timeline(nodes, jobs, "tiresias", throughput=model, check_invariants=True)
    assert result.preemptions == 1
    finish = dict(zip([j.id for j in sorted(jobs, key=lambda j: j.arrival_s)], result.finish_s.tolist(), strict=True))
    # "long" did 4,000 of 10,000 V100-seconds (40% of its work) and restarts on the T4 when it frees at 4,050 s:
    # the 60% left takes 0.6 x 40,000 T4-seconds, not the 6,000 s it had left on the V100.
    assert finish["long"] == pytest.approx(4_050.0 + 0.6 * 40_000.0)
    assert finish["short"] == pytest.approx(4_001.0 + 100.0)


# a and b lose by sharing (0.5 + 0.4 - 1 < 0); a and c gain (0.8 + 0.7 - 1 > 0); a and d cannot run together.
COLOCATION = ColocationModel(
    {("a", "b", "V100M16"): (0.5, 0.4), ("a", "c", "V100M16"): (0.8, 0.7), ("a", "d", "V100M16"): (0.0, 0.0)}
)
SPEEDS = ThroughputModel({(t, "V100M16"): 1.0 for t in "abc"})
ONE_GPU = [NodeSpec("v100", 16_000, 65_536, 1, "V100M16")]


def half_job(name: str, job_type: str, steps: float = 1_000.0) -> TimelineJob:
    return TimelineJob(name, 0.0, HALF, None, job_type, steps)


def finishes(policy: str, jobs: list[TimelineJob], colocation: ColocationModel | None = COLOCATION) -> list[float]:
    result = run_timeline(ONE_GPU, jobs, policy, throughput=SPEEDS, colocation=colocation, check_invariants=True)
    return [round(f, 6) for f in result.finish_s.tolist()]


def test_jobs_sharing_a_gpu_run_at_their_co_location_factors_and_speed_up_when_the_partner_leaves() -> None:
    # fifo-share puts both halves on the GPU: a runs at 0.5 and ends at 2,000 s; b has done 0.4 x 2,000 = 800 steps
    # by then and does the last 200 alone.
    assert finishes("fifo-share", [half_job("a", "a"), half_job("b", "b")]) == [2_000.0, 2_200.0]
    # A pair that cannot run together: the later job waits on the GPU until the earlier one leaves.
    assert finishes("fifo-share", [half_job("a", "a"), half_job("d", "d")]) == [1_000.0, 2_000.0]
    # Without a co-location model nothing slows: both end at 1,000 s.
    assert finishes("fifo-share", [half_job("a", "a"), half_job("b", "b")], None) == [1_000.0, 1_000.0]


def test_tessera_shares_a_gpu_only_between_jobs_that_gain_by_it() -> None:
    # a + b lose: b waits for a's GPU (1,000 s) and both end sooner than sharing would let them.
    assert finishes("tessera", [half_job("a", "a"), half_job("b", "b")]) == [1_000.0, 2_000.0]
    assert finishes("tessera-any-colocation", [half_job("a", "a"), half_job("b", "b")]) == [2_000.0, 2_200.0]
    # a + c gain: they share; a ends at 1,000 / 0.8 s, c has done 0.7 x 1,250 steps by then and finishes alone.
    assert finishes("tessera", [half_job("a", "a"), half_job("c", "c")]) == [1_250.0, 1_375.0]
