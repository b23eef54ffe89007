"""The fidelity runner against the Splitwise simulator's results: its reader, its metrics, its set-up on tiny
synthetic inputs, the benchmark's output, and (with ../shared) the real comparison on one unsaturated row."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from tessera.core.errors import InputFileError
from tessera.serving.models import model_spec
from tessera.serving.perf_model import SplitwiseCompatPerf
from tessera.serving.policies.engine_parts import Completion
from tessera.serving.policies.requests import InferenceRequest
from tessera.sim.serving.fidelity import (
    METRICS,
    PERCENTILES,
    SCORED_METRICS,
    RequestTimes,
    column,
    compare,
    max_rel_err_pct,
    read_results,
    relative_errors,
    splitwise_kv_tokens,
)
from tessera.sim.serving.trace import read_llm_trace

ROOT = Path(__file__).resolve().parents[3]
SHARED = ROOT.parent / "shared" / "traces"
HEADER = "model,hardware,servers,gpus,tensor_parallel,scheduler,requests," + ",".join(
    column(m, p) for m in METRICS for p in PERCENTILES
)
TRACE_HEADER = "request_id,request_type,application_id,arrival_timestamp,batch_size,prompt_size,token_size"


def _perf_csv(path: Path) -> Path:
    """A small characterization grid for llama2-70b on H100 TP8 in the Splitwise format (synthetic times)."""
    lines = ["model,hardware,prompt_size,batch_size,token_size,prompt_time,token_time,tensor_parallel"]
    points = [(p, 1) for p in (128, 256, 512, 1024, 2048, 4096)] + [(512, b) for b in (2, 4, 8, 16, 32)]
    for prompt, batch in points:
        for repeat in range(3):
            prompt_ms = 20 + 0.05 * prompt * batch + repeat * 0.1
            token_ms = 30 + 0.3 * batch + repeat * 0.1
            lines.append(f"llama2-70b,h100-80gb,{prompt},{batch},128,{prompt_ms},{token_ms},8")
    path.write_text("\n".join(lines) + "\n")
    return path


def _trace(path: Path, requests: list[tuple[float, int, int]]) -> Path:
    rows = [f"{i},2,0,{a},1,{p},{o}" for i, (a, p, o) in enumerate(requests)]
    path.write_text(TRACE_HEADER + "\n" + "\n".join(rows) + "\n")
    return path


def _results(path: Path, rows: list[tuple[int, dict[str, float]]]) -> Path:
    lines = [HEADER]
    for servers, values in rows:
        cells = [str(values.get(column(m, p), 1.0)) for m in METRICS for p in PERCENTILES]
        lines.append(f"llama2-70b,h100-80gb,{servers},{8 * servers},8,token_jsq,100," + ",".join(cells))
    path.write_text("\n".join(lines) + "\n")
    return path


def test_read_results_reads_rows_and_flags_saturated_clusters(tmp_path: Path) -> None:
    path = _results(tmp_path / "r.csv", [(2, {column("ttft", 99): 12.0}), (4, {column("ttft", 99): 0.4})])
    rows = read_results(path)
    assert [(r.servers, r.gpus, r.tensor_parallel, r.line) for r in rows] == [(2, 16, 8, 2), (4, 32, 8, 3)]
    assert [r.saturated for r in rows] == [True, False]
    assert rows[1].values[column("ttft", 99)] == 0.4 and rows[1].scheduler == "token_jsq"


@pytest.mark.parametrize(
    ("edit", "where"),
    [
        (lambda text: text.replace("tbt_s_p90,", "tbt_p90,"), r"r\.csv:1: tbt_s_p90: missing column"),
        (lambda text: text.replace(",8,token_jsq", ",eight,token_jsq"), r"r\.csv:2: tensor_parallel: 'eight'"),
        (lambda text: text.replace(",16,8,", ",15,8,"), r"r\.csv:2: gpus: must be a positive multiple"),
        (lambda text: text.replace("token_jsq,100,1.0", "token_jsq,100,-1"), r"r\.csv:2: ttft_s_p50: must be"),
        (lambda text: text.rstrip("\n") + ",9\n", r"r\.csv:2: wrong number of fields"),
        (lambda text: text.splitlines()[0] + "\n", r"r\.csv:1: no rows"),
    ],
)
def test_read_results_names_the_line_and_column_of_bad_input(tmp_path: Path, edit: object, where: str) -> None:
    path = _results(tmp_path / "r.csv", [(2, {})])
    assert callable(edit)
    path.write_text(edit(path.read_text()))
    with pytest.raises(InputFileError, match=where):
        read_results(path)


def test_kv_tokens_are_counted_as_that_simulator_counts_them() -> None:
    spec = model_spec("llama2-70b")
    # 8 x 80 GiB minus the weights, over 2 x 80 layers x 8192 hidden x 2 bytes (every head: no GQA).
    expected = (8 * 80 * 1024**3 - spec.weights_bytes) // (2 * 80 * 8192 * 2)
    assert splitwise_kv_tokens(spec, "H100-80GB", 8) == expected
    assert 200_000 < expected < 215_000
    with pytest.raises(ValueError, match="no KV cache"):
        splitwise_kv_tokens(spec, "H100-80GB", 1)


def test_metrics_are_defined_as_that_simulator_defines_them() -> None:
    requests = [InferenceRequest(0, "m", 1.0, 100, 5), InferenceRequest(1, "m", 2.0, 100, 1)]
    completions = [
        Completion(requests[0], first_token_s=1.5, finish_s=3.5, admitted_s=(1.25, 2.0)),
        Completion(requests[1], first_token_s=2.1, finish_s=2.1, admitted_s=(2.0,)),
        Completion(InferenceRequest(2, "m", 0.0, 10, 1), math.nan, 0.0, refused="too big"),
    ]
    times = RequestTimes.of(completions)
    np.testing.assert_allclose(times.metric("ttft"), [0.5, 0.1])
    np.testing.assert_allclose(times.metric("tbt"), [2.0 / 5, 0.0])  # over all the output tokens, not out - 1
    np.testing.assert_allclose(times.metric("e2e"), [2.5, 0.1])
    np.testing.assert_allclose(times.metric("queue"), [0.25, 0.0])  # to the first admission only
    percentiles = times.percentiles()
    assert percentiles[column("ttft", 50)] == pytest.approx(0.3)  # linear interpolation
    assert set(percentiles) == {column(m, p) for m in METRICS for p in PERCENTILES}


def test_relative_errors_in_percent() -> None:
    errors = relative_errors({"a": 1.1, "b": 0.0, "c": 2.0}, {"a": 1.0, "b": 0.0, "c": 0.0})
    assert errors["a"] == pytest.approx(10.0) and errors["b"] == 0.0 and errors["c"] == math.inf


def test_one_request_on_an_idle_cluster_costs_exactly_that_simulators_iterations(tmp_path: Path) -> None:
    perf_csv = _perf_csv(tmp_path / "perf.csv")
    perf = SplitwiseCompatPerf.from_csv(perf_csv)
    prompt, out = 700, 20
    ttft = perf.iteration_s(prompt, 0, 0)
    decode = perf.iteration_s(0, 1, 0)
    expected = {"ttft": ttft, "tbt": (out - 1) * decode / out, "e2e": ttft + (out - 1) * decode, "queue": 0.0}
    reference = {column(m, p): expected[m] for m in METRICS for p in PERCENTILES}
    trace = read_llm_trace(_trace(tmp_path / "t.csv", [(3.0, prompt, out)]))
    (result,) = compare(trace, read_results(_results(tmp_path / "r.csv", [(1, reference)])), perf_csv, ["compat"])
    assert (result.served, result.refused, result.preemptions) == (1, 0, 0)
    for key, value in reference.items():
        assert result.ours[key] == pytest.approx(value, rel=1e-9, abs=1e-12)
    scored, worst = max_rel_err_pct([result])
    assert scored == 1 and worst == pytest.approx(0.0, abs=1e-6)


def test_token_jsq_spreads_simultaneous_prompts_over_the_servers(tmp_path: Path) -> None:
    perf_csv = _perf_csv(tmp_path / "perf.csv")
    alone = SplitwiseCompatPerf.from_csv(perf_csv).iteration_s(1500, 0, 0)
    trace = read_llm_trace(_trace(tmp_path / "t.csv", [(0.0, 1500, 4), (0.0, 1500, 4)]))
    rows = read_results(_results(tmp_path / "r.csv", [(1, {}), (2, {})]))
    one, two = compare(trace, rows, perf_csv, ["compat"])
    # Two servers: one prompt each, both first tokens after one prefill. One server: 3,000 tokens exceed the
    # 2,048-token budget, so the second prompt waits for the next iteration.
    assert two.ours[column("ttft", 99)] == pytest.approx(alone)
    assert two.ours[column("queue", 99)] == 0.0
    assert one.ours[column("ttft", 99)] > 1.9 * alone
    assert one.ours[column("queue", 99)] == pytest.approx(alone, rel=0.02)


def test_both_modes_run_and_only_unsaturated_rows_are_scored(tmp_path: Path) -> None:
    perf_csv = _perf_csv(tmp_path / "perf.csv")
    rng = np.random.default_rng(0)
    arrivals = np.sort(rng.uniform(0, 20, 120))
    trace = read_llm_trace(
        _trace(
            tmp_path / "t.csv", [(float(a), int(rng.integers(50, 3000)), int(rng.integers(1, 300))) for a in arrivals]
        )
    )
    rows = read_results(_results(tmp_path / "r.csv", [(1, {column("ttft", 99): 50.0}), (3, {})]))
    results = compare(trace, rows, perf_csv, ["compat", "calibrated"])
    assert [(r.mode, r.reference.servers, r.scored) for r in results] == [
        ("compat", 1, False),
        ("compat", 3, True),
        ("calibrated", 1, False),
        ("calibrated", 3, True),
    ]
    for r in results:
        assert r.served == 120 and r.refused == 0
        assert all(math.isfinite(v) for v in r.ours.values())
    compat = [r for r in results if r.mode == "compat"]
    scored, worst = max_rel_err_pct(compat)
    expected = max(abs(compat[1].rel_err_pct[column(m, p)]) for m in SCORED_METRICS for p in PERCENTILES)
    assert scored == 1 and worst == pytest.approx(expected)
    # The synthetic grid's decode step grows with the batch: the batch-aware model serves slower than compat's.
    assert results[3].ours[column("tbt", 50)] > compat[1].ours[column("tbt", 50)]


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("serving_fidelity", ROOT / "bench" / "serving_fidelity.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bench_prints_a_table_then_one_json_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = [
        "--trace",
        str(_trace(tmp_path / "t.csv", [(0.0, 300, 10), (0.5, 900, 30), (0.7, 100, 5)])),
        "--results",
        str(_results(tmp_path / "r.csv", [(1, {}), (2, {column("ttft", 99): 10.0})])),
        "--perf-model",
        str(_perf_csv(tmp_path / "perf.csv")),
        "--mode",
        "compat",
    ]
    assert _bench().main(args) == 0
    out = capsys.readouterr().out.strip().splitlines()
    summary = json.loads(out[-1])
    assert summary["rows"] == 1 and summary["mode"] == "compat"
    assert summary["max_rel_err_pct"] > 0 and set(summary["by_mode"]) == {"compat"}
    assert any("ttft" in line and "%" in line for line in out[:-1])


def test_bench_names_the_bad_line_and_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    results = _results(tmp_path / "r.csv", [(1, {})])
    results.write_text(results.read_text().replace(",8,token_jsq", ",x,token_jsq"))
    args = ["--trace", str(_trace(tmp_path / "t.csv", [(0.0, 300, 10)])), "--results", str(results)]
    args += ["--perf-model", str(_perf_csv(tmp_path / "perf.csv"))]
    assert _bench().main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "r.csv:2: tensor_parallel" in err[0]


@pytest.mark.skipif(not (SHARED / "splitwise-results").is_dir(), reason="needs ../shared/traces/splitwise-results")
def test_the_real_comparison_on_one_unsaturated_row_computes_its_errors() -> None:
    rows = [r for r in read_results(SHARED / "splitwise-results" / "results_llama2-70b_h100.csv") if not r.saturated]
    trace = read_llm_trace(SHARED / "splitwise-results" / "rr_conv_70_2min.csv")
    (result,) = compare(trace, rows[-1:], SHARED / "splitwise" / "perf_model.csv", ["compat"])
    assert result.served == len(trace) == result.reference.requests
    assert set(result.rel_err_pct) == {column(m, p) for m in METRICS for p in PERCENTILES}
    assert all(math.isfinite(v) for v in result.rel_err_pct.values())
    assert max_rel_err_pct([result]) == (1, result.max_scored_err_pct())
