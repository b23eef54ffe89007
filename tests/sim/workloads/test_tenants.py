"""The tenants workload: queue specs, priority classes and bursty, contending demand."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from tessera.core.errors import InvalidRequestError
from tessera.sim.workloads.jobs import PRIORITY_BEST_EFFORT, PRIORITY_INFERENCE, PRIORITY_TRAINING, TimelineJob
from tessera.sim.workloads.tenants import TenantQueue, tenant_queues, tenants_cluster, tenants_workload

DAY_S = 86_400.0


def demand_gpus(jobs: list[TimelineJob], queue: str, grid_s: np.ndarray) -> np.ndarray:
    """GPUs the queue's jobs would hold at each grid time if each started on arrival."""
    demand = np.zeros(len(grid_s))
    for job in jobs:
        if job.queue == queue and job.duration_s is not None:
            running = (grid_s >= job.arrival_s) & (grid_s < job.arrival_s + job.duration_s)
            demand[running] += job.total_gpu_milli / 1000
    return demand


def test_the_workload_is_deterministic_per_seed() -> None:
    assert tenants_workload(1, DAY_S) == tenants_workload(1, DAY_S)
    assert tenants_workload(2, DAY_S)[1] != tenants_workload(1, DAY_S)[1]


def test_queue_specs_add_up_to_the_cluster() -> None:
    nodes, _, queues = tenants_workload(0, 3600.0)
    assert nodes == tenants_cluster() and queues == tenant_queues()
    assert [q.name for q in queues] == ["team-a", "team-b", "team-c"]
    assert {q.cohort for q in queues} == {"org"}
    assert sum(q.total_nominal_gpu_milli for q in queues) == 1000 * sum(n.gpu_count for n in nodes) == 96_000
    assert queues[0].as_dict() == {
        "name": "team-a",
        "cohort": "org",
        "nominal_gpu_milli": {"*": 40_000},
        "borrowing_limit_gpu_milli": 24_000,
        "lending_limit_gpu_milli": 32_000,
        "weight": 1.0,
    }


def test_jobs_carry_their_priority_class_and_queue() -> None:
    _, jobs, queues = tenants_workload(0, DAY_S)
    names = {q.name for q in queues}
    kinds: Counter[tuple[str, str]] = Counter()
    for job in jobs:
        kind = job.id.split("-")[2]
        kinds[(job.queue, kind)] += 1
        assert job.queue in names and job.request.queue == job.queue and job.request.priority == job.priority
        assert 0.0 <= job.arrival_s < DAY_S and job.duration_s is not None and job.duration_s > 0
        if kind == "svc":
            assert (job.priority, job.preemptible) == (PRIORITY_INFERENCE, False)
            assert job.arrival_s + job.duration_s == pytest.approx(DAY_S)
        elif kind == "train":
            assert (job.priority, job.preemptible) == (PRIORITY_TRAINING, True)
            assert job.gang in (1, 2, 4, 8) and job.request.gpu_milli == 1000 and job.job_type
        else:
            assert (job.priority, job.preemptible, job.checkpointed) == (PRIORITY_BEST_EFFORT, True, False)
            assert job.request.gpu_milli in (250, 500)
    assert kinds[("team-a", "svc")] == 4 and kinds[("team-b", "svc")] == 2 and kinds[("team-c", "svc")] == 0
    assert all(kinds[(q, "train")] > 50 and kinds[(q, "be")] > 50 for q in names)
    assert [job.arrival_s for job in jobs] == sorted(job.arrival_s for job in jobs)


def test_demand_is_bursty_and_contends_for_the_cluster() -> None:
    nodes, jobs, queues = tenants_workload(0, DAY_S)
    grid_s = np.arange(0.0, DAY_S, 600.0)
    total = np.zeros(len(grid_s))
    for queue in queues:
        demand = demand_gpus(jobs, queue.name, grid_s)
        total += demand
        nominal = queue.total_nominal_gpu_milli / 1000
        assert (demand > nominal).mean() > 0.1, queue.name  # bursts above its quota...
        assert (demand < nominal / 2).mean() > 0.1, queue.name  # ...and quiet spells that leave capacity to lend
        hourly = np.histogram([j.arrival_s for j in jobs if j.queue == queue.name], bins=24, range=(0, DAY_S))[0]
        assert hourly.var() / hourly.mean() > 2.0, queue.name  # over-dispersed: not a steady Poisson stream
    assert (total > sum(n.gpu_count for n in nodes)).mean() > 0.1  # together they want more than the cluster


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"nominal_gpu_milli": {"*": -1}}, "nominal_gpu_milli"),
        ({"cohort": None, "borrowing_limit_gpu_milli": 1000}, "borrowing_limit_gpu_milli"),
        ({"lending_limit_gpu_milli": -5}, "lending_limit_gpu_milli"),
        ({"lending_limit_gpu_milli": 9000}, "lending_limit_gpu_milli"),
        ({"weight": 0.0}, "weight"),
        ({"name": ""}, "name"),
    ],
)
def test_bad_queue_specs_name_the_field(kwargs: dict[str, object], field: str) -> None:
    spec: dict[str, object] = {"name": "q", "cohort": "c", "nominal_gpu_milli": {"*": 8000}, **kwargs}
    with pytest.raises(InvalidRequestError) as info:
        TenantQueue(**spec)  # type: ignore[arg-type]
    assert info.value.field == field


def test_bad_parameters_are_rejected() -> None:
    with pytest.raises(InvalidRequestError, match="horizon_s"):
        tenants_workload(0, 0.0)
    with pytest.raises(InvalidRequestError, match="burst_load"):
        tenants_workload(0, DAY_S, burst_load=-1.0)
