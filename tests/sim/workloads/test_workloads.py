"""Timeline workloads: TimelineJob checks, the openb timeline on a scaled cluster, and the training workload."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from tessera.core.cluster import NodeSpec
from tessera.core.errors import InvalidRequestError
from tessera.core.throughput import ThroughputModel
from tessera.core.workload import Request
from tessera.sim.traces.openb import TracePod, load_nodes, load_pods
from tessera.sim.workloads.gavel import default_models
from tessera.sim.workloads.jobs import PRIORITY_BEST_EFFORT, PRIORITY_INFERENCE, PRIORITY_TRAINING, TimelineJob
from tessera.sim.workloads.openb import openb_timeline, synthetic_openb_timeline
from tessera.sim.workloads.philly import MAX_RUNTIME_S, MIN_RUNTIME_S, PHILLY_MEDIAN_S, philly_runtime_sampler
from tessera.sim.workloads.synthetic import synthetic_nodes, synthetic_pods
from tessera.sim.workloads.training import training_workload

TRACES = Path(__file__).resolve().parents[3].parent / "shared" / "traces"
OPENB_NODES = TRACES / "openb" / "openb_node_list_gpu_node.csv"
OPENB_PODS = TRACES / "openb" / "openb_pod_list_default.csv"
PHILLY = TRACES / "philly" / "philly_runtime.csv"
PAI = TRACES / "pai" / "pai_machine_spec.csv"

GPU = Request(num_gpus=1, gpu_milli=1000)


def gpus_by_model(nodes: list[NodeSpec]) -> Counter[str]:
    counts: Counter[str] = Counter()
    for node in nodes:
        if node.gpu_model:
            counts[node.gpu_model] += node.gpu_count
    return counts


# ----------------------------------------------------------------------------------------------- TimelineJob


def test_a_job_runs_for_a_duration_or_for_work_never_both() -> None:
    TimelineJob("a", 0.0, GPU, 10.0)
    TimelineJob("b", 5.0, GPU, None, job_type="ResNet-50", work_steps=100.0)
    with pytest.raises(InvalidRequestError, match="exactly one"):
        TimelineJob("c", 0.0, GPU, 10.0, job_type="x", work_steps=1.0)
    with pytest.raises(InvalidRequestError, match="exactly one"):
        TimelineJob("d", 0.0, GPU, None)
    with pytest.raises(InvalidRequestError, match="job_type"):
        TimelineJob("e", 0.0, GPU, None, work_steps=1.0)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"arrival_s": -1.0}, "arrival_s"),
        ({"arrival_s": float("nan")}, "arrival_s"),
        ({"duration_s": -1.0}, "duration_s"),
        ({"gang": 0}, "gang"),
        ({"elastic_min": 1}, "elastic_min"),
        ({"gang": 2, "elastic_min": 3, "elastic_max": 4}, "elastic_min"),
        ({"gang": 4, "elastic_min": 1, "elastic_max": 2}, "elastic_min"),
        ({"id": ""}, "id"),
    ],
)
def test_bad_jobs_name_the_field(kwargs: dict[str, object], field: str) -> None:
    fields: dict[str, object] = {"id": "j", "arrival_s": 0.0, "request": GPU, "duration_s": 1.0, **kwargs}
    with pytest.raises(InvalidRequestError) as info:
        TimelineJob(**fields)  # type: ignore[arg-type]
    assert info.value.field == field


def test_gang_and_elastic_helpers() -> None:
    job = TimelineJob("g", 0.0, GPU, 1.0, gang=4, elastic_min=2, elastic_max=8)
    assert job.is_elastic and job.total_gpu_milli == 4000
    assert not TimelineJob("r", 0.0, GPU, 1.0).is_elastic


# ----------------------------------------------------------------------------------------------------- openb


def test_openb_pods_keep_their_times_and_qos_sets_the_priority_class() -> None:
    nodes = synthetic_nodes(40, seed=1)
    pods = [
        TracePod("p-ls", GPU, 100, 400, 100, "LS"),
        TracePod("p-be", Request(num_gpus=1, gpu_milli=300), 50, 50, 50, "BE"),
        TracePod("p-burst", Request(cpu_milli=1000), 70, 90, None, "Burstable"),
        TracePod("p-untimed", GPU, None, None, None, "LS"),
        TracePod("p-huge", Request(num_gpus=64, gpu_milli=1000), 10, 20, None, "LS"),
    ]
    scaled, jobs = openb_timeline(pods, nodes, 1.0)
    assert scaled == nodes
    assert [job.id for job in jobs] == ["p-be", "p-burst", "p-ls"]  # sorted by arrival; untimed and unfit skipped
    be, burst, ls = jobs
    assert (ls.arrival_s, ls.duration_s, ls.priority, ls.preemptible) == (100.0, 300.0, PRIORITY_INFERENCE, False)
    assert ls.request.priority == ls.priority and ls.queue == ls.request.queue == "default"
    assert be.duration_s == 1.0  # deleted in the second it came: runs the minimum
    assert (be.priority, be.preemptible) == (PRIORITY_BEST_EFFORT, True)
    assert (burst.priority, burst.preemptible) == (PRIORITY_TRAINING, True)
    assert all(job.work_steps is None and job.gang == 1 and not job.checkpointed for job in jobs)


def test_the_synthetic_openb_timeline_is_deterministic_per_seed() -> None:
    nodes_a, jobs_a = synthetic_openb_timeline(3, 0.5, num_nodes=60, num_pods=300)
    nodes_b, jobs_b = synthetic_openb_timeline(3, 0.5, num_nodes=60, num_pods=300)
    assert (nodes_a, jobs_a) == (nodes_b, jobs_b)
    assert synthetic_openb_timeline(4, 0.5, num_nodes=60, num_pods=300)[1] != jobs_a
    full = synthetic_nodes(60, 3)
    pods = synthetic_pods(300, 3, nodes=full)
    assert len(jobs_a) == sum(1 for pod in pods if pod.creation_time_s is not None)
    assert 0.4 < sum(n.gpu_count for n in nodes_a) / sum(n.gpu_count for n in full) < 0.6


def test_a_scaled_cluster_keeps_the_model_mix() -> None:
    nodes = synthetic_nodes(600, seed=2)
    scaled, _ = openb_timeline([], nodes, 0.25)
    full, small = gpus_by_model(nodes), gpus_by_model(scaled)
    assert set(small) == set(full)  # every model keeps at least one node
    for model, gpus in full.items():
        if gpus >= 100:
            assert small[model] / gpus == pytest.approx(0.25, abs=0.03), model


@pytest.mark.skipif(not OPENB_PODS.exists(), reason="../shared/traces/openb is not here")
def test_the_openb_default_trace_on_a_quarter_of_its_gpus() -> None:
    nodes, pods = load_nodes(OPENB_NODES), load_pods(OPENB_PODS)
    scaled, jobs = openb_timeline(pods, nodes, 0.25)
    full, small = gpus_by_model(nodes), gpus_by_model(scaled)
    assert sum(small.values()) == pytest.approx(0.25 * sum(full.values()), rel=0.03)
    for model, gpus in full.items():
        if gpus >= 100:
            assert small[model] / gpus == pytest.approx(0.25, abs=0.03), model
    assert len(jobs) == len(pods) == 8152  # every pod still fits some node
    by_name = {pod.name: pod for pod in pods}
    for job in jobs[:200]:
        pod = by_name[job.id]
        assert job.arrival_s == pod.creation_time_s
        assert pod.deletion_time_s is not None and pod.creation_time_s is not None
        assert job.duration_s == max(1.0, pod.deletion_time_s - pod.creation_time_s)


# -------------------------------------------------------------------------------------------------- training


def test_the_training_workload_is_deterministic_per_seed() -> None:
    nodes_a, jobs_a = training_workload(7, 200)
    nodes_b, jobs_b = training_workload(7, 200)
    assert nodes_a == nodes_b and jobs_a == jobs_b
    assert training_workload(8, 200)[1] != jobs_a


def test_training_jobs_are_gavel_style_gangs_with_calibrated_work() -> None:
    model, _ = default_models()
    nodes, jobs = training_workload(1, 3000, throughput_model=model)
    assert len(jobs) == 3000 and len(nodes) == 64
    assert [job.arrival_s for job in jobs] == sorted(job.arrival_s for job in jobs) and jobs[0].arrival_s == 0.0
    gangs = Counter(job.gang for job in jobs)
    assert set(gangs) <= {1, 2, 4, 8}
    assert gangs[1] / len(jobs) == pytest.approx(0.70, abs=0.03)
    assert gangs[4] / len(jobs) == pytest.approx(0.15, abs=0.03)
    assert set(Counter(job.job_type for job in jobs)) == set(model.job_types)
    reference_runtime = np.array(
        [job.work_steps / model.throughput(job.job_type, model.reference_model) for job in jobs]  # type: ignore[operator, arg-type]
    )
    assert reference_runtime.min() >= MIN_RUNTIME_S - 1e-6 and reference_runtime.max() <= MAX_RUNTIME_S + 1e-6
    assert float(np.median(reference_runtime)) == pytest.approx(PHILLY_MEDIAN_S, rel=0.2)
    for job in jobs:
        assert job.duration_s is None and job.preemptible and job.priority == PRIORITY_TRAINING
        assert job.request.num_gpus == 1 and job.request.gpu_milli == 1000
        if job.is_elastic:
            assert job.elastic_min == max(1, job.gang // 2) and job.elastic_max == 2 * job.gang
    assert 0.1 < sum(job.is_elastic for job in jobs) / len(jobs) < 0.3
    assert 0.7 < sum(job.checkpointed for job in jobs) / len(jobs) < 0.9


def test_arrivals_are_poisson_at_the_given_rate() -> None:
    _, jobs = training_workload(2, 4000, arrival_rate_per_s=0.01)
    gaps = np.diff([job.arrival_s for job in jobs])
    assert float(gaps.mean()) == pytest.approx(100.0, rel=0.06)
    assert float(gaps.std() / gaps.mean()) == pytest.approx(1.0, abs=0.06)  # exponential: cv = 1


def test_offered_load_sets_the_arrival_rate() -> None:
    _, light = training_workload(3, 500, offered_load=0.5)
    _, heavy = training_workload(3, 500, offered_load=2.0)
    assert light[-1].arrival_s == pytest.approx(4 * heavy[-1].arrival_s)
    with pytest.raises(InvalidRequestError, match="offered_load"):
        training_workload(3, 10, offered_load=0.0)


def test_a_small_given_cluster_caps_the_gang_size() -> None:
    nodes = [NodeSpec("n0", 32_000, 128 * 1024, 2, "T4"), NodeSpec("n1", 32_000, 128 * 1024, 1, "A100-80GB")]
    returned, jobs = training_workload(4, 400, nodes, ThroughputModel({("x", "V100"): 2.0}))
    assert returned == nodes
    assert {job.gang for job in jobs} == {1, 2}
    assert {job.job_type for job in jobs} == {"x"}


def test_bad_training_parameters_are_rejected() -> None:
    with pytest.raises(InvalidRequestError, match="num_jobs"):
        training_workload(0, 0)
    with pytest.raises(InvalidRequestError, match="elastic_share"):
        training_workload(0, 10, elastic_share=1.5)
    with pytest.raises(InvalidRequestError, match="cluster"):
        training_workload(0, 10, [NodeSpec("cpu", 1000, 1024, 0, None)])
    with pytest.raises(InvalidRequestError, match="arrival_rate_per_s"):
        training_workload(0, 10, arrival_rate_per_s=-1.0)
    with pytest.raises(InvalidRequestError, match="unknown cluster"):
        training_workload(0, 10, "philly")  # type: ignore[arg-type]


@pytest.mark.skipif(not (PHILLY.exists() and PAI.exists()), reason="../shared/traces is not here")
def test_training_on_the_pai_cluster_with_philly_runtimes() -> None:
    model, _ = default_models()
    sampler = philly_runtime_sampler(PHILLY)
    nodes, jobs = training_workload(5, 4000, "pai", model, sampler, pai_path=PAI, pai_max_nodes=100)
    assert len(nodes) == 100
    assert {n.gpu_model for n in nodes} == {"P100", "T4", "V100M16", "V100M32", "G2"}
    runtime = [job.work_steps / model.reference_steps_per_s(job.job_type) for job in jobs]  # type: ignore[operator, arg-type]
    assert float(np.median(runtime)) == pytest.approx(1186.0, rel=0.2)


def test_sharing_training_jobs_ask_for_half_a_gpu_and_change_no_other_draw() -> None:
    _, plain = training_workload(5, 600)
    _, shared = training_workload(5, 600, sharing_share=0.5)
    sharing = [job for job in shared if job.request.gpu_milli < 1000]
    assert all(job.request.gpu_milli == 500 and job.gang == 1 and not job.is_elastic for job in sharing)
    singles = [job for job in shared if job.gang == 1 and not job.is_elastic]
    assert 0.4 < len(sharing) / len(singles) < 0.6
    # Same job types, gangs, work and elastic ranges; arrivals come faster, since shares offer less GPU time.
    strip = [(j.id, j.job_type, j.gang, j.work_steps, j.elastic_min, j.checkpointed) for j in plain]
    assert strip == [(j.id, j.job_type, j.gang, j.work_steps, j.elastic_min, j.checkpointed) for j in shared]
    assert shared[-1].arrival_s < plain[-1].arrival_s
    assert training_workload(5, 600, sharing_share=0.0) == training_workload(5, 600)
    with pytest.raises(InvalidRequestError, match="sharing_share"):
        training_workload(0, 10, sharing_share=-0.1)
