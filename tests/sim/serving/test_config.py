"""StudyConfig: every bad value is an InvalidRequestError naming the command-line option; cluster specs."""

from __future__ import annotations

from pathlib import Path

import pytest

from tessera.core.errors import InvalidRequestError
from tessera.sim.serving.config import (
    StudyConfig,
    parse_gpu_cluster,
    parse_model_mix,
    parse_named_path,
    parse_policy_names,
)


@pytest.mark.parametrize(
    ("change", "option", "words"),
    [
        ({"models": 0}, "--models", "1..256"),
        ({"models": 257}, "--models", "1..256"),
        ({"zipf": -0.1}, "--zipf", ">= 0"),
        ({"zipf": float("nan")}, "--zipf", ">= 0"),
        ({"load": 0.0}, "--load", "> 0"),
        ({"load": 100.5}, "--load", "<= 100"),
        ({"policies": ("static", "fifo")}, "--setup", "static, static-autoscale, tessera"),
        ({"policies": ()}, "--setup", "no setup"),
        ({"policies": ("tessera", "tessera")}, "--setup", "twice"),
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
    with pytest.raises(InvalidRequestError, match="unknown serving setup 'ray'"):
        parse_policy_names("static,ray")


def _config_json(folder: Path) -> Path:
    path = folder / "config.json"
    keys = '"num_hidden_layers": 28, "hidden_size": 3584, "num_attention_heads": 28, "num_key_value_heads": 4'
    path.write_text("{" + keys + ', "intermediate_size": 18944, "vocab_size": 152064, "torch_dtype": "bfloat16"}')
    return path


def test_the_model_mix_names_known_or_brought_models(tmp_path: Path) -> None:
    config = StudyConfig(model_mix=("mine", "bloom-176b"), model_configs=(("mine", _config_json(tmp_path)),))
    book = config.model_book()
    assert config.mix == ("mine", "bloom-176b")
    assert book.spec("mine").kv_heads == 4 and book.spec("bloom-176b").tensor_parallel == 8
    assert StudyConfig().mix[:3] == ("llama2-13b", "llama3-8b", "llama2-70b")  # the default pattern


def test_an_unknown_model_in_the_mix_is_refused_with_the_known_ones_and_how_to_bring_one() -> None:
    with pytest.raises(InvalidRequestError) as caught:
        StudyConfig(model_mix=("llama3-8b", "mistral-7b")).model_book()
    assert caught.value.field == "--model-mix"
    assert "unknown model 'mistral-7b' (known: llama2-7b, llama3-8b" in caught.value.message
    assert "bloom-176b" in caught.value.message and "--model-config NAME=config.json" in caught.value.message


def test_a_brought_model_the_mix_leaves_out_is_refused_not_ignored(tmp_path: Path) -> None:
    with pytest.raises(InvalidRequestError, match="mine is not in the default --model-mix") as caught:
        StudyConfig(model_configs=(("mine", _config_json(tmp_path)),)).model_book()
    assert caught.value.field == "--model-config"
    profile = tmp_path / "p.csv"
    profile.write_text("kind,batch_size,tokens,kv_tokens,time_ms\nprefill,1,512,0,50\ndecode,1,,500,20\n")
    with pytest.raises(InvalidRequestError, match="bloom-176b is not in --model-mix \\(llama3-8b\\)") as caught:
        StudyConfig(model_mix=("llama3-8b",), model_profiles=(("bloom-176b", profile),)).model_book()
    assert caught.value.field == "--model-profile"


@pytest.mark.parametrize(
    ("text", "required", "words"),
    [
        ("mine", True, "not NAME=PATH"),
        ("=x.json", True, "names no model"),
        ("mine=/nonexistent/config.json", True, "no such file"),
    ],
)
def test_named_paths_are_parsed_with_errors_naming_the_option(text: str, required: bool, words: str) -> None:
    with pytest.raises(InvalidRequestError, match=words) as caught:
        parse_named_path(text, "--model-config", required)
    assert caught.value.field == "--model-config"


def test_a_named_path_and_a_mix_parse(tmp_path: Path) -> None:
    path = _config_json(tmp_path)
    assert parse_named_path(f" mine ={path}", "--model-config") == ("mine", path)
    assert parse_named_path(str(path), "--model-profile", name_required=False) == (None, path)
    assert parse_model_mix(" llama3-8b, mine") == ("llama3-8b", "mine")
    with pytest.raises(InvalidRequestError, match="separated by commas"):
        parse_model_mix("llama3-8b,,mine")


def test_knobs_change_every_setup_studied_and_a_bad_one_names_set() -> None:
    config = StudyConfig(policies=("static", "tessera"), knobs=("router=least-load", "late_binding=false"))
    for name in ("static", "tessera"):
        setup = config.setup(name)
        assert (setup.router, setup.late_binding) == ("least-load", False)
    assert config.setup("tessera").autoscaler == "tessera"  # what no knob names stays the setup's own
    sizing = StudyConfig(knobs=("adaptive=false", "shared_gangs=off")).setup("tessera").sizing
    assert (sizing.adaptive, sizing.shared_gangs, sizing.shared) == (False, False, True)  # the sizing's own knobs
    for knob, words in (("routr=x", "unknown serving knob 'routr'"), ("router=nope", "router:"), ("tick_s=-1", "> 0")):
        with pytest.raises(InvalidRequestError) as caught:
            StudyConfig(knobs=(knob,))
        assert caught.value.field == "--set" and words in caught.value.message
