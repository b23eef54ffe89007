"""The fidelity runner on models other than llama2-70b (issue 27: it refused every model outside the serving
catalog, bloom-176b of the Splitwise grid included): bloom-176b by name on a synthetic grid and (with ../shared) on
the measured one, a model brought by its config.json and its own rows, and the benchmark's command line."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path
from types import ModuleType

import pytest

from tessera.core.errors import InputFileError
from tessera.serving.model_book import build_model_book
from tessera.serving.models import GRID_MODELS
from tessera.serving.perf_csv import read_splitwise_rows
from tessera.serving.perf_model import SplitwiseCompatPerf
from tessera.sim.serving.fidelity import (
    METRICS,
    PERCENTILES,
    column,
    compare,
    perf_for,
    read_results,
    row_spec,
    splitwise_kv_tokens,
)
from tessera.sim.serving.trace import read_llm_trace

ROOT = Path(__file__).resolve().parents[3]
SHARED = ROOT.parent / "shared" / "traces"
RESULTS_HEADER = "model,hardware,servers,gpus,tensor_parallel,scheduler,requests," + ",".join(
    column(m, p) for m in METRICS for p in PERCENTILES
)
TRACE_HEADER = "request_id,request_type,application_id,arrival_timestamp,batch_size,prompt_size,token_size"
GRID_HEADER = "model,hardware,prompt_size,batch_size,token_size,prompt_time,token_time,tensor_parallel"


def _grid(path: Path, model: str, tp: int = 8, scale: float = 1.0) -> Path:
    lines = [GRID_HEADER]
    points = [(p, 1) for p in (128, 256, 512, 1024, 2048, 4096)] + [(512, b) for b in (2, 4, 8, 16, 32)]
    for prompt, batch in points:
        for repeat in range(3):
            prefill_ms = scale * (50 + 0.12 * prompt * batch) + repeat * 0.1
            token_ms = scale * (60 + 0.5 * batch) + repeat * 0.1
            lines.append(f"{model},h100-80gb,{prompt},{batch},128,{prefill_ms},{token_ms},{tp}")
    path.write_text("\n".join(lines) + "\n")
    return path


def _results(path: Path, model: str, servers: list[int], requests: int, tp: int = 8) -> Path:
    cells = ",".join("1.0" for _ in METRICS for _ in PERCENTILES)
    rows = [f"{model},h100-80gb,{s},{8 * s},{tp},token_jsq,{requests},{cells}" for s in servers]
    path.write_text(RESULTS_HEADER + "\n" + "\n".join(rows) + "\n")
    return path


def _trace(path: Path, count: int) -> Path:
    rows = [f"{i},2,0,{0.05 * i},1,{200 + 37 * i % 1800},{5 + i % 60}" for i in range(count)]
    path.write_text(TRACE_HEADER + "\n" + "\n".join(rows) + "\n")
    return path


def test_bloom_176b_rows_run_with_its_shape_and_its_own_grid_rows(tmp_path: Path) -> None:
    grid = _grid(tmp_path / "perf.csv", "bloom-176b")
    rows = read_results(_results(tmp_path / "r.csv", "bloom-176b", [1, 2], requests=60))
    spec, gpu = row_spec(rows[0])
    assert spec == GRID_MODELS["bloom-176b"] and gpu == "H100-80GB"
    # The simulator's KV accounting with bloom's shape: 8 x 80 GiB less 352 GB of weights, 4 MiB a token.
    expected = (8 * 80 * 1024**3 - spec.weights_bytes) // (2 * 70 * 14336 * 2)
    assert splitwise_kv_tokens(spec, gpu, 8) == expected and 70_000 < expected < 90_000
    compat = perf_for("compat", grid, spec, gpu, rows[0])
    assert compat == SplitwiseCompatPerf.from_rows(read_splitwise_rows(grid))
    trace = read_llm_trace(_trace(tmp_path / "t.csv", 60))
    results = compare(trace, rows, grid, ["compat", "calibrated"])
    runs = [(r.mode, r.reference.servers) for r in results]
    assert runs == [(m, s) for m in ("compat", "calibrated") for s in (1, 2)]
    for result in results:
        assert result.served == 60 and result.refused == 0
        assert all(math.isfinite(v) for v in result.ours.values())


def test_a_model_brought_by_its_config_and_rows_runs_and_an_unknown_one_is_named(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    shape = {"num_hidden_layers": 48, "hidden_size": 6144, "num_attention_heads": 48, "num_key_value_heads": 8}
    config.write_text(json.dumps(shape | {"intermediate_size": 16384, "vocab_size": 64000, "torch_dtype": "float16"}))
    own = _grid(tmp_path / "mine.csv", "mine-30b", scale=0.5)
    results_csv = _results(tmp_path / "r.csv", "mine-30b", [1], requests=40)
    rows = read_results(results_csv)
    trace = read_llm_trace(_trace(tmp_path / "t.csv", 40))
    llama_grid = _grid(tmp_path / "llama.csv", "llama2-70b")
    with pytest.raises(InputFileError) as caught:
        compare(trace, rows, llama_grid, ["compat"])
    assert str(caught.value).startswith(f"{results_csv}:2: model: unknown model 'mine-30b'")
    assert "--model-config NAME=config.json" in str(caught.value)
    book = build_model_book([("mine-30b", config)], [(None, own)])
    (result,) = compare(trace, rows, llama_grid, ["compat"], book=book)  # its rows come from its own file
    assert result.served == 40
    alone = SplitwiseCompatPerf.from_rows(read_splitwise_rows(own)).iteration_s(500, 0, 0)
    assert perf_for("compat", llama_grid, *row_spec(rows[0], book), rows[0], book).iteration_s(500, 0, 0) == alone


@pytest.mark.skipif(not (SHARED / "splitwise").is_dir(), reason="needs ../shared/traces/splitwise")
def test_bloom_176b_replays_on_the_measured_grid(tmp_path: Path) -> None:
    grid = SHARED / "splitwise" / "perf_model.csv"
    rows = read_results(_results(tmp_path / "r.csv", "bloom-176b", [2], requests=300))
    trace = read_llm_trace(_trace(tmp_path / "t.csv", 300))
    compat, calibrated = compare(trace, rows, grid, ["compat", "calibrated"])
    measured = [r for r in read_splitwise_rows(grid) if r.config == ("bloom-176b", "h100-80gb", 8)]
    assert len(measured) > 50  # the file measures bloom-176b on H100 at TP8: both modes read those rows
    single = SplitwiseCompatPerf.from_rows(measured).iteration_s(0, 1, 0)
    for result in (compat, calibrated):
        assert result.served == 300
        assert result.ours[column("tbt", 50)] > 0.5 * single  # a decode step of bloom, not of a smaller model


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("serving_fidelity", ROOT / "bench" / "serving_fidelity.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_bench_takes_bloom_176b_and_brought_models(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = str(_trace(tmp_path / "t.csv", 30))
    grid = str(_grid(tmp_path / "perf.csv", "bloom-176b"))
    results = str(_results(tmp_path / "r.csv", "bloom-176b", [1], requests=30))
    args = ["--trace", trace, "--results", results, "--perf-model", grid, "--mode", "compat"]
    assert _bench().main(args) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["rows"] == 1 and summary["mode"] == "compat"
    unknown = str(_results(tmp_path / "u.csv", "mine-30b", [1], requests=30))
    args = ["--trace", trace, "--results", unknown, "--perf-model", grid, "--model-config", "mine-30b"]
    assert _bench().main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--model-config" in err[0] and "NAME=PATH" in err[0]
