"""Elastic jobs in the timeline simulator (``Preset.elastic``, ``tessera`` only): growth into idle GPUs,
shrinking for higher priority and for a queue reclaiming its quota, runtime that follows the worker count, and the
books (allocation, quota charge) kept through every resize; every run checks the invariants after each step."""

import dataclasses

import pytest

from tessera.core.cluster import NodeSpec
from tessera.core.invariants import InvariantViolation, check_charges
from tessera.core.presets import PRESETS, REFERENCE_PRESETS, Preset
from tessera.core.queueing import QueueSpec, QuotaLedger, ResourceVector
from tessera.core.queueing.quotas import Admission
from tessera.core.scheduler import RunningWorkload
from tessera.core.throughput import ThroughputModel
from tessera.core.workload import Placement
from tessera.sim.replay.progress import Progress
from tessera.sim.replay.timeline import run_timeline
from tessera.sim.workloads.jobs import PRIORITY_INFERENCE, PRIORITY_TRAINING, TimelineJob, training_worker

NODE = [NodeSpec("n0", 64_000, 262_144, 4, "T4")]
MODEL = ThroughputModel({("Transformer", "T4"): 1.0})  # one step per second with the whole gang
WORKER_QUOTA = ResourceVector(1000, 4000, 16 * 1024)  # what one training worker is charged


def elastic(
    name: str, gang: int, low: int, high: int, steps: float, queue: str = "default", arrival_s: float = 0.0
) -> TimelineJob:
    return TimelineJob(
        name, arrival_s, training_worker(queue), None, "Transformer", steps, queue, PRIORITY_TRAINING,
        preemptible=True, gang=gang, elastic_min=low, elastic_max=high, checkpointed=True,
    )  # fmt: skip


def fixed(
    name: str, gang: int, arrival_s: float, duration_s: float, queue: str = "default", priority: int = 0
) -> TimelineJob:
    worker = training_worker(queue, priority)
    return TimelineJob(name, arrival_s, worker, duration_s, queue=queue, priority=priority, gang=gang)


def quota(workers: int) -> dict[str, ResourceVector]:
    return {
        "*": ResourceVector(
            WORKER_QUOTA.gpu_milli * workers, WORKER_QUOTA.cpu_milli * workers, WORKER_QUOTA.mem_mib * workers
        )
    }


def elastic_bounds(job: TimelineJob, preset: Preset) -> tuple[int | None, int | None]:
    return preset.elastic_bounds(job.elastic_min, job.elastic_max, job.work_steps is None)


def test_only_tessera_runs_elastic_jobs_and_never_fixed_duration_ones() -> None:
    assert [name for name, p in PRESETS.items() if p.elastic] == ["tessera"]
    job = elastic("e", 2, 1, 4, 100.0)
    tessera, gavel = PRESETS["tessera"], PRESETS["gavel"]
    assert elastic_bounds(job, tessera) == (1, 4) and elastic_bounds(job, gavel) == (None, None)
    pod = TimelineJob("p", 0.0, training_worker("default"), 50.0, gang=2, elastic_min=1, elastic_max=4)
    assert elastic_bounds(pod, tessera) == (None, None)
    assert elastic_bounds(pod, REFERENCE_PRESETS["tessera-elastic-durations"]) == (1, 4)
    result = run_timeline(NODE, [pod], "tessera", throughput=MODEL, check_invariants=True)
    assert result.grown_workers == 0 and float(result.finish_s[0]) == pytest.approx(50.0)


def test_an_elastic_job_grows_into_idle_gpus_and_finishes_earlier_than_rigid() -> None:
    jobs = [elastic("e", 2, 1, 4, 7200.0)]  # 7,200 s with its 2 workers
    rigid = run_timeline(NODE, jobs, "gavel", throughput=MODEL, check_invariants=True)
    grown = run_timeline(NODE, jobs, "tessera", throughput=MODEL, check_invariants=True)
    assert float(rigid.finish_s[0]) == pytest.approx(7200.0) and rigid.grown_workers == 0
    assert grown.grown_workers == 2  # all 4 GPUs from the start: twice the speed
    assert float(grown.finish_s[0]) == pytest.approx(3600.0)
    assert grown.gpu_alloc_pct == pytest.approx(100.0)


def test_it_shrinks_to_its_minimum_for_higher_priority_and_the_runtime_follows_the_workers() -> None:
    jobs = [
        elastic("e", 4, 2, 4, 7200.0),  # all 4 GPUs
        fixed("urgent", 2, 1000.0, 600.0, priority=PRIORITY_INFERENCE),
    ]
    result = run_timeline(NODE, jobs, "tessera", throughput=MODEL, check_invariants=True)
    starts = {s.job_id: s for s in result.starts}
    assert result.preemptions == 0 and len(result.starts) == 2
    assert starts["urgent"].time_s == 1000.0  # on the two workers e gave back
    assert result.shrunk_workers == 2 and result.grown_workers == 2  # and grown back when it left
    # 1,000 s at full speed, 600 s at half speed (300 s of work), then full speed again for the 5,900 s left.
    assert float(result.finish_s[0]) == pytest.approx(1600.0 + 5900.0)
    assert result.gpu_alloc_pct == pytest.approx(100.0)


def test_with_queues_growth_is_charged_to_the_quota() -> None:
    queues = [QueueSpec("a", None, quota(3)), QueueSpec("b", None, quota(1))]
    jobs = [elastic("e", 2, 1, 4, 7200.0, queue="a")]
    result = run_timeline(NODE, jobs, "tessera", throughput=MODEL, queues=queues, check_invariants=True)
    assert result.grown_workers == 1  # to a's nominal 3, not onto the 4th GPU (b's quota, no cohort)
    assert float(result.finish_s[0]) == pytest.approx(7200.0 * 2 / 3)


def test_with_queues_borrowed_growth_is_reclaimed_by_a_shrink_within_the_step() -> None:
    queues = [QueueSpec("a", "c", quota(2)), QueueSpec("b", "c", quota(2))]
    jobs = [elastic("e", 2, 1, 4, 7200.0, queue="a"), fixed("owner", 2, 1000.0, 600.0, queue="b")]
    result = run_timeline(NODE, jobs, "tessera", throughput=MODEL, queues=queues, check_invariants=True)
    starts = {s.job_id: s.time_s for s in result.starts}
    assert starts == {"e": 0.0, "owner": 1000.0}  # b takes its quota back at once, nothing preempted
    assert result.preemptions == 0 and result.reclaim_latency_max_s == 0.0
    assert result.shrunk_workers == 2 and result.grown_workers == 4  # borrowed twice, given back once
    # 1,000 s at 4 workers (2,000 s of work), 600 s at 2 (600 s), then 4 again for the 4,600 s left.
    assert float(result.finish_s[0]) == pytest.approx(1600.0 + 4600.0 / 2)
    assert result.queue_shares["b"] == pytest.approx(1.0)


def test_progress_follows_the_worker_count() -> None:
    progress = Progress(100.0, 10.0, 2, 4)  # 100 s left with all 4 workers, running on 2 since t = 10
    assert progress.end_s == pytest.approx(210.0)
    assert progress.left_at(50.0) == pytest.approx(80.0)
    grown = progress.changed(50.0, workers=8)
    assert grown.end_s == pytest.approx(90.0)  # 80 s of work at twice the speed


def test_check_charges_catches_a_resize_that_forgot_its_quota() -> None:
    ledger = QuotaLedger([QueueSpec("a", None, quota(4))])
    placement = Placement(0, (0,), training_worker("a"), 1000)
    admission = ledger.admit("a", "*", WORKER_QUOTA)
    one = RunningWorkload("e", "a", 0, (placement,), admission, 0.0)
    check_charges(ledger, [one])
    grown = dataclasses.replace(one, placements=(placement, Placement(0, (1,), training_worker("a"), 1000)))
    with pytest.raises(InvariantViolation):
        check_charges(ledger, [grown])  # two workers, charged for one
    charged = dataclasses.replace(
        grown, admission=Admission("a", "*", WORKER_QUOTA + WORKER_QUOTA, ResourceVector.zero())
    )
    with pytest.raises(InvariantViolation):
        check_charges(ledger, [charged])  # the ledger holds one worker's charge
