"""StudyConfig: every bad value is an InvalidRequestError naming the command-line option; cluster specs."""

from __future__ import annotations

from pathlib import Path

import pytest

from tessera.core.errors import InvalidRequestError
from tessera.sim.serving.config import StudyConfig, parse_gpu_cluster, parse_policy_names


@pytest.mark.parametrize(
    ("change", "option", "words"),
    [
        ({"models": 0}, "--models", "1..256"),
        ({"models": 257}, "--models", "1..256"),
        ({"zipf": -0.1}, "--zipf", ">= 0"),
        ({"zipf": float("nan")}, "--zipf", ">= 0"),
        ({"load": 0.0}, "--load", "> 0"),
        ({"load": 100.5}, "--load", "<= 100"),
        ({"policies": ("static", "fifo")}, "--policies", "static, static-autoscale, tessera"),
        ({"policies": ()}, "--policies", "no policy"),
        ({"policies": ("tessera", "tessera")}, "--policies", "twice"),
        ({"seeds": ()}, "--seeds", "at least one"),
        ({"seeds": (1, 1)}, "--seeds", "distinct"),
        ({"seeds": (-1,)}, "--seeds", ">= 0"),
        ({"gpus": "64xH100-80GB", "gpus_for_slo": True}, "--gpus", "not both"),
        ({"gpus": "64xB300"}, "--gpus", "unknown GPU type 'B300'"),
        ({"gpus": "H100"}, "--gpus", "count x GPU model"),
        ({"gpus": "0xH100"}, "--gpus", ">= 1"),
        ({"perf_profile": Path("/nonexistent/profile.csv")}, "--perf-profile", "no such file"),
    ],
)
def test_a_bad_value_names_its_option(change: dict[str, object], option: str, words: str) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        StudyConfig(**change)  # type: ignore[arg-type]
    assert caught.value.field == option
    assert words in caught.value.message


def test_defaults_are_valid_and_use_the_synthetic_trace() -> None:
    config = StudyConfig()
    assert config.policies == ("static", "static-autoscale", "tessera")
    assert config.cluster is None
    assert config.trace_name == "synthetic-azure-like"
    assert len(config.load_trace()) > 10_000


def test_a_gpu_cluster_is_split_into_nodes_of_eight() -> None:
    cluster = parse_gpu_cluster(" 20 x h100 ")
    assert (cluster.count, cluster.model.name) == (20, "H100-80GB")
    assert cluster.node_gpu_counts == (8, 8, 4)
    assert str(cluster) == "20xH100-80GB"
    assert StudyConfig(gpus="64xA100-80GB").cluster == parse_gpu_cluster("64xA100-80GB")


def test_policy_names_are_parsed_from_a_comma_list() -> None:
    assert parse_policy_names(" Static, tessera ,") == ("static", "tessera")
    with pytest.raises(InvalidRequestError, match="unknown policy 'ray'"):
        parse_policy_names("static,ray")
