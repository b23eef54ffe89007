"""The timeline simulator on small hand-made workloads: queueing, FIFO blocking, backfill, metrics."""

from dataclasses import dataclass

import numpy as np
import pytest

from tessera.core.cluster import NodeSpec
from tessera.core.errors import InvalidRequestError
from tessera.core.presets import PRESETS, whole_gpu_request
from tessera.core.queueing import QueueSpec, ResourceVector
from tessera.core.throughput import ThroughputModel
from tessera.core.workload import Request
from tessera.sim.replay.timeline import run_timeline
from tessera.sim.workloads.jobs import TimelineJob


@dataclass(frozen=True)
class Job:
    id: str
    arrival_s: float
    request: Request
    duration_s: float | None
    work_steps: float | None = None
    job_type: str | None = None
    gang: int = 1
    priority: int = 0
    checkpointed: bool = False


NODES = [NodeSpec("n0", 16_000, 65_536, 1, "T4")]
HALF = Request(num_gpus=1, gpu_milli=500, cpu_milli=1000)
WHOLE = Request(num_gpus=1, gpu_milli=1000, cpu_milli=1000)


def test_sharing_runs_two_half_gpu_jobs_at_once_where_static_binding_queues_them() -> None:
    jobs = [Job("a", 0.0, HALF, 100.0), Job("b", 0.0, HALF, 100.0)]
    shared = run_timeline(NODES, jobs, "fifo-share")
    static = run_timeline(NODES, jobs, "static")
    assert sorted(shared.jct_s.tolist()) == [100.0, 100.0]
    assert sorted(static.jct_s.tolist()) == [100.0, 200.0]
    assert static.gpu_alloc_pct == pytest.approx(100.0)
    assert shared.gpu_alloc_pct == pytest.approx(100.0)


def test_strict_fifo_blocks_and_backfill_does_not() -> None:
    nodes = [NodeSpec("n0", 16_000, 65_536, 2, "T4")]
    jobs = [
        Job("running", 0.0, WHOLE, 100.0),
        Job("pair", 1.0, Request(num_gpus=2, gpu_milli=1000, cpu_milli=1000), 10.0),
        Job("small", 2.0, HALF, 10.0),
    ]
    fifo = run_timeline(nodes, jobs, "fifo-share")
    backfill = run_timeline(nodes, jobs, "tessera")
    # Results list finished jobs in job order: running, pair, small.
    assert fifo.wait_s.tolist() == [0.0, 99.0, 108.0]  # "small" waits behind "pair", which waits for "running"
    assert backfill.wait_s.tolist()[2] == 0.0  # backfilled next to "running"


def test_a_job_that_never_fits_is_counted_not_lost() -> None:
    jobs = [Job("too-big", 0.0, Request(num_gpus=4, gpu_milli=1000), 5.0), Job("ok", 0.0, HALF, 5.0)]
    result = run_timeline(NODES, jobs, "tessera")
    assert result.unfinished == 1 and result.jct_s.tolist() == [5.0]


def test_static_rounds_shares_up_and_unknown_policies_name_the_option() -> None:
    assert whole_gpu_request(HALF).gpu_milli == 1000
    with pytest.raises(InvalidRequestError) as info:
        run_timeline(NODES, [], "magic")
    assert info.value.field == "--policies"
    assert np.isfinite(run_timeline(NODES, [Job("a", 0.0, HALF, 1.0)], "static").gpu_alloc_pct)


# ---------------------------------------------------------------------------------------------- queues (tenants)


def test_under_tessera_the_owner_reclaims_at_once_and_every_queue_gets_its_entitlement() -> None:
    nodes = [NodeSpec("n0", 64_000, 262_144, 4, "T4")]
    quota = {"*": ResourceVector(2000, 32_000, 131_072)}
    queues = [QueueSpec("a", "org", quota), QueueSpec("b", "org", quota)]

    def job(name: str, queue: str, arrival_s: float) -> TimelineJob:
        request = Request(num_gpus=1, gpu_milli=1000, cpu_milli=1000, queue=queue)
        return TimelineJob(name, arrival_s, request, 100.0, queue=queue, preemptible=True, checkpointed=True)

    jobs = [job(f"b{i}", "b", 0.0) for i in range(4)] + [job(f"a{i}", "a", 10.0) for i in range(2)]
    result = run_timeline(nodes, jobs, "tessera", queues=queues)
    assert result.preemptions == 2 and result.reclaims == 2 and result.reclaim_latency_max_s == 0.0
    assert all(share >= 0.95 for share in result.queue_shares.values()), result.queue_shares
    assert result.jain_index > 0.99
    assert sorted(result.jct_s.tolist()) == [100.0] * 4 + [190.0, 190.0]  # resumed at 100 s with 90 s left
    static = run_timeline(nodes, jobs, "fifo-share", queues=queues)
    assert static.preemptions == 0 and static.queue_shares["b"] < result.queue_shares["b"]  # no borrowing


# ------------------------------------------------------------------------------------------ tiresias and gavel


def test_tiresias_lets_a_short_late_job_overtake_a_long_early_one_by_preemption() -> None:
    jobs = [Job("long", 0.0, WHOLE, 20_000.0, checkpointed=True), Job("short", 4_000.0, WHOLE, 100.0)]
    las = run_timeline(NODES, jobs, "tiresias")
    # After 4,000 GPU-seconds (> 1 GPU-hour) "long" is in a lower LAS queue: "short" preempts it and runs at once.
    assert las.preemptions == 1
    assert las.jct_s.tolist() == [20_100.0, 100.0]  # "long" resumes from its checkpoint after "short"
    static = run_timeline(NODES, jobs, "static")
    assert static.preemptions == 0 and static.jct_s.tolist()[1] == 20_000.0 - 4_000.0 + 100.0


def test_tiresias_respects_the_minimum_run_time_before_preempting() -> None:
    nodes = [NodeSpec("n0", 64_000, 262_144, 8, "T4")]
    wide = Request(num_gpus=8, gpu_milli=1000, cpu_milli=1000)
    # "wide" reaches 1 GPU-hour after 450 s on 8 GPUs, but may not be preempted before it has run 600 s.
    jobs = [Job("wide", 0.0, wide, 20_000.0, checkpointed=True), Job("late", 100.0, WHOLE, 100.0)]
    result = run_timeline(nodes, jobs, "tiresias")
    assert result.preemptions == 1 and result.wait_s.tolist() == [0.0, 500.0]


def test_tiresias_preempts_when_a_running_job_is_demoted_while_another_waits() -> None:
    # "wait" arrives at 3,000 s while "long" (queue 0 until 3,600 GPU-s) runs: it waits, then the demotion frees it.
    jobs = [Job("long", 0.0, WHOLE, 20_000.0, checkpointed=True), Job("wait", 3_000.0, WHOLE, 100.0)]
    result = run_timeline(NODES, jobs, "tiresias")
    assert result.preemptions == 1 and result.wait_s.tolist()[1] == pytest.approx(600.0)


def test_gavel_sends_a_job_type_that_gains_on_v100_to_the_v100_node() -> None:
    nodes = [NodeSpec("a-t4", 16_000, 65_536, 1, "T4"), NodeSpec("b-v100", 16_000, 65_536, 1, "V100M16")]
    model = ThroughputModel({("Transformer", "V100M16"): 4.0, ("Transformer", "T4"): 1.0})
    jobs = [Job("t", 0.0, WHOLE, None, work_steps=400.0, job_type="Transformer")]
    gavel = run_timeline(nodes, jobs, "gavel", throughput=model)
    assert gavel.jct_s.tolist() == [100.0]  # 400 steps at 4 steps/s on the V100
    assert gavel.preemptions == 0
    static = run_timeline(nodes, jobs, "static", throughput=model)  # best-fit ignores speed: first node, the T4
    assert static.jct_s.tolist() == [400.0]


def test_tiresias_never_preempts_a_job_that_cannot_checkpoint() -> None:
    """Preempting it would restart it from zero under any policy; only the reference policy assumes a checkpoint."""
    jobs = [Job("long", 0.0, WHOLE, 20_000.0), Job("short", 4_000.0, WHOLE, 100.0)]
    las = run_timeline(NODES, jobs, "tiresias")
    assert las.preemptions == 0 and las.jct_s.tolist() == [20_000.0, 16_100.0]
    paper = run_timeline(NODES, jobs, "tiresias-all-checkpointed")
    assert paper.preemptions == 1 and paper.jct_s.tolist() == [20_100.0, 100.0]


def test_preemption_counts_are_reported_for_every_policy() -> None:
    jobs = [Job("long", 0.0, WHOLE, 20_000.0, checkpointed=True), Job("short", 4_000.0, WHOLE, 100.0)]
    counts = {name: run_timeline(NODES, jobs, name).preemptions for name in PRESETS}
    assert counts == {"static": 0, "fifo-share": 0, "tiresias": 1, "gavel": 0, "tessera": 0}


def test_las_still_preempts_when_tenant_queues_are_given() -> None:
    """Regression: with queues, tiresias keeps its within-queue preemption by LAS level."""
    quota = {"*": ResourceVector(1000, 16_000, 65_536)}
    queues = [QueueSpec("default", None, quota, strategy="BestEffortFIFO")]
    jobs = [Job("long", 0.0, WHOLE, 20_000.0, checkpointed=True), Job("short", 4_000.0, WHOLE, 100.0)]
    assert run_timeline(NODES, jobs, "tiresias", queues=queues).preemptions == 1
