"""The model book: which names a study may serve, where each one's architecture and timing come from, and the
refusals that name what is missing (an unknown name, a profile without an architecture, a profile without a name)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tessera.core.errors import InputFileError, InvalidRequestError
from tessera.serving.gpus import gpu_spec
from tessera.serving.model_book import ModelBook, ProfileFormat, build_model_book, profile_format
from tessera.serving.models import CATALOG, GRID_MODELS
from tessera.serving.perf_csv import read_splitwise_rows
from tessera.serving.perf_model import CalibratedPerf, ProfilePerf, ReplicaShape, RooflinePerf

SPLITWISE_HEADER = "model,hardware,prompt_size,batch_size,token_size,prompt_time,token_time,tensor_parallel"
GQA_CONFIG = {
    "model_type": "qwen2",
    "num_hidden_layers": 28,
    "hidden_size": 3584,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "intermediate_size": 18944,
    "vocab_size": 152064,
    "torch_dtype": "bfloat16",
    "tie_word_embeddings": False,
}
PROFILE = """kind,batch_size,tokens,kv_tokens,time_ms
prefill,1,512,0,50
prefill,2,1024,0,90
decode,1,,500,20
decode,8,,8000,24
decode,32,,32000,35
"""


def _config(folder: Path, config: dict[str, object] = GQA_CONFIG) -> Path:
    path = folder / "config.json"
    path.write_text(json.dumps(config))
    return path


def _grid(path: Path, rows: list[tuple[str, str, int, float]]) -> Path:
    """A Splitwise-format grid: per (model, hardware, TP, scale) a batch sweep and a prompt sweep, times x scale."""
    lines = [SPLITWISE_HEADER]
    for model, hardware, tp, scale in rows:
        points = [(p, 1) for p in (128, 512, 2048)] + [(512, b) for b in (2, 8, 32)]
        for prompt, batch in points:
            prefill_ms = scale * (20 + 0.05 * prompt * batch)
            decode_ms = scale * (30 + 0.3 * batch + 0.0001 * batch * prompt)
            lines.append(f"{model},{hardware},{prompt},{batch},128,{prefill_ms},{decode_ms},{tp}")
    path.write_text("\n".join(lines) + "\n")
    return path


def test_the_default_book_knows_the_catalog_and_bloom_176b() -> None:
    book = ModelBook.default()
    assert set(book.entries) == set(CATALOG) | {"bloom-176b"}
    assert book.spec("bloom-176b") == GRID_MODELS["bloom-176b"]
    assert book.entries["llama3-8b"].architecture == "catalog"
    assert book.entries["bloom-176b"].architecture == "Splitwise grid"


def test_an_unknown_name_is_refused_listing_the_known_ones_and_how_to_bring_one() -> None:
    with pytest.raises(InvalidRequestError) as caught:
        ModelBook.default().spec("mistral-7b", "--model-mix")
    message = str(caught.value)
    assert caught.value.field == "--model-mix" and "'mistral-7b'" in message
    assert "llama2-7b, llama3-8b, llama2-13b, codellama-34b, llama2-70b, bloom-176b" in message
    assert "--model-config NAME=config.json" in message and "--model-profile" in message


def test_a_config_brings_a_model_timed_like_a_catalog_model_without_a_profile(tmp_path: Path) -> None:
    path = _config(tmp_path)
    book = build_model_book([("qwen2-7b", path)])
    spec = book.spec("qwen2-7b")
    assert spec.kv_heads == 4 and spec.params_b == pytest.approx(7.62, rel=0.01)
    assert book.entries["qwen2-7b"].architecture == str(path)
    # No calibration file: the roofline, as for a catalog model; with one: calibrated and scaled to it.
    assert isinstance(book.perf(spec, "H100-80GB", 1, None), RooflinePerf)
    grid = _grid(tmp_path / "grid.csv", [("llama2-70b", "h100-80gb", 2, 1.0), ("llama2-70b", "h100-80gb", 4, 0.6)])
    scaled = book.perf(spec, "H100-80GB", 1, grid)
    assert isinstance(scaled, CalibratedPerf)
    assert scaled.source == ReplicaShape(spec, gpu_spec("H100-80GB"), 1)
    line = book.describe("qwen2-7b", "calibrated on grid.csv")
    assert line.startswith("qwen2-7b: 7.62B parameters") and "56 KiB of KV cache per token, TP 1" in line
    assert f"architecture: {path}" in line and line.endswith("timing: calibrated on grid.csv")


def test_a_config_may_not_take_a_known_name(tmp_path: Path) -> None:
    with pytest.raises(InvalidRequestError, match="llama3-8b is already known \\(catalog\\)") as caught:
        build_model_book([("llama3-8b", _config(tmp_path))])
    assert caught.value.field == "--model-config"


def test_a_splitwise_profile_times_its_model_from_its_own_rows(tmp_path: Path) -> None:
    # "mine" measured on A100 only; llama2-70b (ten times faster here) on H100. Timing mine on an H100 must come
    # from mine's rows, scaled, not from the other model that the H100 rows hold.
    grid = _grid(tmp_path / "g.csv", [("mine", "a100-80gb", 1, 10.0), ("llama2-70b", "h100-80gb", 4, 1.0)])
    book = build_model_book([("mine", _config(tmp_path))], [(None, grid)])
    spec = book.spec("mine")
    entry = book.entries["mine"]
    assert entry.profile is not None and entry.profile.format is ProfileFormat.SPLITWISE
    assert book.entries["llama2-70b"].profile is not None  # the file retimes every model it holds
    measured = book.perf(spec, "A100-80GB", 1)
    rows = [r for r in read_splitwise_rows(grid) if r.model == "mine"]
    assert measured == CalibratedPerf.from_rows(rows, {"mine": spec})  # its measured configuration, unscaled
    on_h100 = book.perf(spec, "H100-80GB", 1)
    from_llama = ModelBook.default().perf(spec, "H100-80GB", 1, grid)  # what a model without a profile gets
    assert on_h100.iteration_s(0, 8, 8000) > 3 * from_llama.iteration_s(0, 8, 8000)
    assert book.grid_for("mine", tmp_path / "other.csv") == grid


def test_a_profile_in_the_project_format_times_the_model_it_names(tmp_path: Path) -> None:
    profile = tmp_path / "p.csv"
    profile.write_text(PROFILE)
    book = build_model_book(profiles=[("bloom-176b", profile)])
    perf = book.perf(book.spec("bloom-176b"), "H100-80GB", 8)
    assert isinstance(perf, ProfilePerf) and perf.iteration_s(512, 0, 0) == pytest.approx(0.05)
    assert perf.source == ReplicaShape(GRID_MODELS["bloom-176b"], gpu_spec("H100-80GB"), 8)
    with pytest.raises(InvalidRequestError, match="is a profile, not Splitwise"):
        book.grid_for("bloom-176b", tmp_path / "grid.csv")


def test_a_profile_alone_does_not_make_an_architecture(tmp_path: Path) -> None:
    grid = _grid(tmp_path / "g.csv", [("mystery-9b", "h100-80gb", 1, 1.0)])
    with pytest.raises(InvalidRequestError) as caught:
        build_model_book(profiles=[(None, grid)])
    assert caught.value.field == "--model-profile"
    assert "'mystery-9b'" in str(caught.value) and "--model-config mystery-9b=config.json" in str(caught.value)
    assert "timings only" in str(caught.value)
    book = build_model_book([("mystery-9b", _config(tmp_path))], [(None, grid)])  # with its architecture: brought
    assert book.entries["mystery-9b"].profile is not None


def test_a_profile_needs_a_name_and_a_named_model_must_be_in_the_file(tmp_path: Path) -> None:
    profile = tmp_path / "p.csv"
    profile.write_text(PROFILE)
    with pytest.raises(InvalidRequestError, match="name its model, NAME=PATH"):
        build_model_book(profiles=[(None, profile)])
    grid = _grid(tmp_path / "g.csv", [("llama2-70b", "h100-80gb", 4, 1.0)])
    with pytest.raises(InputFileError, match="no rows for 'bloom-176b' \\(the file has: llama2-70b\\)"):
        build_model_book(profiles=[("bloom-176b", grid)])
    with pytest.raises(InvalidRequestError, match="llama2-70b is given two profiles"):
        build_model_book(profiles=[(None, grid), ("llama2-70b", profile)])


def test_a_splitwise_profile_on_a_gpu_without_figures_is_refused_at_its_line(tmp_path: Path) -> None:
    grid = _grid(tmp_path / "g.csv", [("llama2-70b", "h100-80gb", 4, 1.0), ("bloom-176b", "mi300x", 8, 1.0)])
    with pytest.raises(InputFileError, match=r"g\.csv:8: hardware: unknown GPU 'mi300x'.*h100-80gb.*H200"):
        build_model_book(profiles=[(None, grid)])
    assert build_model_book(profiles=[("llama2-70b", grid)]).entries["llama2-70b"].profile is not None
    lowercase_l4 = _grid(tmp_path / "l4.csv", [("llama2-70b", "l4", 8, 1.0)])  # any GPU name of the catalog
    assert build_model_book(profiles=[(None, lowercase_l4)]).entries["llama2-70b"].profile is not None


def test_the_format_is_told_by_the_header(tmp_path: Path) -> None:
    profile = tmp_path / "p.csv"
    profile.write_text("# measured on one L4\n\n" + PROFILE)
    assert profile_format(profile) is ProfileFormat.PROFILE
    assert profile_format(_grid(tmp_path / "g.csv", [])) is ProfileFormat.SPLITWISE
    other = tmp_path / "o.csv"
    other.write_text("# comment\nmodel,latency\nx,1\n")
    with pytest.raises(InputFileError, match=r"o\.csv:2: neither a Splitwise perf-model CSV"):
        profile_format(other)
