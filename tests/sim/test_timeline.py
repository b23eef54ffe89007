"""The timeline simulator on small hand-made workloads: queueing, FIFO blocking, backfill, metrics."""

from dataclasses import dataclass

import numpy as np
import pytest

from tessera.core.cluster import NodeSpec
from tessera.core.errors import InvalidRequestError
from tessera.core.workload import Request
from tessera.sim.timeline import run_timeline, whole_gpu_request


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

from tessera.core.queueing import QueueSpec, ResourceVector  # noqa: E402
from tessera.sim.jobs import TimelineJob  # noqa: E402


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
