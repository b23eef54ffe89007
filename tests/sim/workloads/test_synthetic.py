"""Tests of the synthetic openb-shaped cluster and pod generator (tessera.sim.workloads.synthetic)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tessera.core.catalog import resolve_model
from tessera.core.errors import InvalidRequestError
from tessera.sim.traces.openb import TracePod, check_pods_fit, load_nodes, load_pods
from tessera.sim.workloads.synthetic import (
    NODE_MIX,
    PodTimes,
    synthetic_nodes,
    synthetic_pods,
    write_nodes_csv,
    write_pods_csv,
)

SHARE_MILLI = {810, 470, 320, 650, 230, 460, 590, 160, 550, 220, 370, 110, 480, 50}


def kind(pod: TracePod) -> str:
    req = pod.request
    if req.num_gpus == 0:
        return "cpu"
    if req.is_sharing:
        return "share"
    return "whole" if req.num_gpus == 1 else "multi"


def gpu_capacity_milli(num_nodes: int = 300) -> int:
    return 1000 * sum(n.gpu_count for n in synthetic_nodes(num_nodes))


# ----------------------------------------------------------------------------------------------------- nodes


@pytest.mark.parametrize("num_nodes", [1, 7, 300, 1213])
def test_node_count_names_and_models(num_nodes: int) -> None:
    nodes = synthetic_nodes(num_nodes)
    assert len(nodes) == num_nodes
    assert [n.name for n in nodes] == [f"syn-node-{i:04d}" for i in range(num_nodes)]
    assert all(n.gpu_model is not None and resolve_model(n.gpu_model).name == n.gpu_model for n in nodes)
    assert all(n.gpu_count > 0 for n in nodes)


def test_full_size_mix_equals_openb_counts() -> None:
    shapes = Counter((n.cpu_milli // 1000, n.mem_mib // 1024, n.gpu_count, n.gpu_model) for n in synthetic_nodes(1213))
    assert shapes == Counter({row[1:]: row[0] for row in NODE_MIX})
    assert sum(n.gpu_count for n in synthetic_nodes(1213)) == 6212


def test_default_mix_is_proportional() -> None:
    nodes = synthetic_nodes()
    counts = Counter((n.gpu_count, n.gpu_model) for n in nodes)
    assert counts[(8, "G2")] == round(300 * 549 / 1213)
    assert counts[(2, "T4")] == round(300 * 387 / 1213)
    gpus_per_node = sum(n.gpu_count for n in nodes) / len(nodes)
    assert gpus_per_node == pytest.approx(6212 / 1213, rel=0.02)


def test_nodes_deterministic_and_seed_only_reorders() -> None:
    assert synthetic_nodes(50, seed=4) == synthetic_nodes(50, seed=4)
    a, b = synthetic_nodes(50, seed=4), synthetic_nodes(50, seed=5)
    assert a != b
    assert sorted((n.cpu_milli, n.gpu_count, str(n.gpu_model)) for n in a) == sorted(
        (n.cpu_milli, n.gpu_count, str(n.gpu_model)) for n in b
    )


def test_bad_node_count() -> None:
    with pytest.raises(InvalidRequestError) as info:
        synthetic_nodes(0)
    assert info.value.field == "num_nodes"


# ------------------------------------------------------------------------------------------------------ pods


def test_pods_deterministic_per_seed() -> None:
    assert synthetic_pods(300, seed=9) == synthetic_pods(300, seed=9)
    assert synthetic_pods(300, seed=9) != synthetic_pods(300, seed=10)
    pods = synthetic_pods(300)
    assert [p.name for p in pods] == [f"syn-pod-{i:04d}" for i in range(300)]


def test_kind_shares_resemble_openb() -> None:
    pods = synthetic_pods(20000, seed=1)
    share = {k: v / len(pods) for k, v in Counter(kind(p) for p in pods).items()}
    assert share["cpu"] == pytest.approx(0.133, abs=0.01)
    assert share["share"] == pytest.approx(0.378, abs=0.015)
    assert share["whole"] == pytest.approx(0.480, abs=0.015)
    assert share["multi"] == pytest.approx(0.009, abs=0.003)


def test_request_values_come_from_documented_sets() -> None:
    pods = synthetic_pods(5000, seed=2)
    assert {p.request.gpu_milli for p in pods if kind(p) == "share"} <= SHARE_MILLI
    assert {p.request.num_gpus for p in pods if kind(p) == "multi"} <= {2, 4, 8}
    assert all(p.request.gpu_milli == 1000 for p in pods if kind(p) in ("whole", "multi"))
    assert all(8000 <= p.request.cpu_milli <= 32000 for p in pods if kind(p) == "cpu")
    assert all(p.request.gpu_types == frozenset() for p in pods)
    assert {p.qos for p in pods} <= {"LS", "BE", "Burstable", "Guaranteed"}


@pytest.mark.parametrize("seed", range(5))
def test_default_gpu_demand_is_near_capacity(seed: int) -> None:
    demand = sum(p.request.total_gpu_milli for p in synthetic_pods(seed=seed))
    assert 0.9 <= demand / gpu_capacity_milli() <= 1.0


def test_times() -> None:
    pods = synthetic_pods(20000, seed=3)
    creation = np.array([p.creation_time_s for p in pods])
    deletion = np.array([p.deletion_time_s for p in pods])
    assert creation[0] == 0
    assert (np.diff(creation) >= 0).all()
    assert (deletion > creation).all()
    assert all(p.scheduled_time_s == p.creation_time_s for p in pods)
    assert np.median(deletion - creation) == pytest.approx(3600, rel=0.1)
    assert np.mean(np.diff(creation)) == pytest.approx(30, rel=0.1)
    slow = synthetic_pods(2000, seed=3, times=PodTimes(mean_interarrival_s=600.0, median_duration_s=60.0))
    lifetimes = np.array([p.deletion_time_s for p in slow]) - np.array([p.creation_time_s for p in slow])
    assert np.median(lifetimes) == pytest.approx(60, rel=0.15)


def test_constrained_pods_fit_the_default_cluster() -> None:
    nodes = synthetic_nodes()
    models = {n.gpu_model for n in nodes}
    pods = synthetic_pods(4000, seed=4, constrained_share=1.0)
    gpu_pods = [p for p in pods if p.request.num_gpus]
    assert all(p.request.gpu_types and p.request.gpu_types <= models for p in gpu_pods)
    assert any(len(p.request.gpu_types) == 2 for p in gpu_pods)
    check_pods_fit(pods, nodes, "synthetic")


def test_constrained_share_is_respected() -> None:
    pods = synthetic_pods(10000, seed=5, constrained_share=0.25)
    gpu_pods = [p for p in pods if p.request.num_gpus]
    constrained = sum(1 for p in gpu_pods if p.request.gpu_types) / len(gpu_pods)
    assert constrained == pytest.approx(0.25, abs=0.02)


def test_constraints_follow_the_given_nodes() -> None:
    nodes = [n for n in synthetic_nodes() if n.gpu_model in ("T4", "G3")]
    pods = synthetic_pods(2000, seed=6, constrained_share=1.0, nodes=nodes)
    assert set().union(*(p.request.gpu_types for p in pods)) <= {"T4", "G3"}
    check_pods_fit(pods, nodes, "synthetic")


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"num_pods": 0}, "num_pods"),
        ({"constrained_share": 1.5}, "constrained_share"),
        ({"constrained_share": -0.1}, "constrained_share"),
    ],
)
def test_bad_pod_arguments(kwargs: dict[str, float], field: str) -> None:
    with pytest.raises(InvalidRequestError) as info:
        synthetic_pods(**kwargs)  # type: ignore[arg-type]
    assert info.value.field == field


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"mean_interarrival_s": 0.0}, "mean_interarrival_s"),
        ({"median_duration_s": -1.0}, "median_duration_s"),
        ({"duration_sigma": -0.5}, "duration_sigma"),
    ],
)
def test_bad_times(kwargs: dict[str, float], field: str) -> None:
    with pytest.raises(InvalidRequestError) as info:
        PodTimes(**kwargs)
    assert info.value.field == field


@settings(max_examples=25, deadline=None)
@given(num_pods=st.integers(1, 300), seed=st.integers(0, 2**32 - 1), share=st.floats(0.0, 1.0))
def test_any_seed_gives_valid_pods_that_fit(num_pods: int, seed: int, share: float) -> None:
    pods = synthetic_pods(num_pods, seed=seed, constrained_share=share)
    assert len(pods) == num_pods
    check_pods_fit(pods, synthetic_nodes(), "synthetic")
    assert all(p.deletion_time_s is not None and p.creation_time_s is not None for p in pods)


# ---------------------------------------------------------------------------------------------------- export


def test_export_default_and_read_back(tmp_path: Path) -> None:
    nodes, pods = synthetic_nodes(), synthetic_pods()
    write_nodes_csv(nodes, tmp_path / "nodes.csv")
    write_pods_csv(pods, tmp_path / "pods.csv")
    assert load_nodes(tmp_path / "nodes.csv") == nodes
    loaded = load_pods(tmp_path / "pods.csv")
    assert [(p.name, p.request, p.creation_time_s, p.deletion_time_s, p.qos) for p in loaded] == [
        (p.name, p.request, p.creation_time_s, p.deletion_time_s, p.qos) for p in pods
    ]
