"""``tessera simulate serving``, run in-process with typer's CliRunner: the report, and one-line errors (exit 2)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_checks import assert_one_line_error
from typer.testing import CliRunner, Result

from tessera.cli.main import app

runner = CliRunner()

HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens"


def _trace(folder: Path, rows: int = 40, bad: tuple[int, str] | None = None) -> Path:
    """A small Azure-format trace: ``rows`` requests one second apart; ``bad`` replaces data row i (0-based)."""
    lines = [HEADER] + [
        f"2023-11-16 18:{i // 60:02d}:{i % 60:02d}.5000000,{100 + 7 * i},{5 + i % 9}" for i in range(rows)
    ]
    if bad is not None:
        lines[bad[0] + 1] = bad[1]
    path = folder / "trace.csv"
    path.write_text("\n".join(lines) + "\n")
    return path


def _serve(*args: str) -> Result:
    return runner.invoke(app, ["simulate", "serving", *args])


def test_writes_the_report_and_prints_the_summary(tmp_path: Path) -> None:
    out = tmp_path / "report"
    args = ["--trace", str(_trace(tmp_path)), "--models", "2", "--policies", "static,tessera", "--seeds", "0-1"]
    result = _serve(*args, "--out", str(out))

    assert result.exit_code == 0, result.output
    for name in ("summary.json", "summary.md", "runs.csv", "gpus.png", "ttft_cdf.png"):
        assert (out / name).is_file(), name
        assert str(out / name) in result.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["trace"] == "trace"
    assert summary["models"] == 2
    assert summary["seeds"] == [0, 1]
    assert list(summary["policies"]) == ["static", "tessera"]
    assert "# Serving study: trace" in result.stdout
    assert "| tessera |" in result.stdout


def test_runs_without_a_trace_on_the_synthetic_one(tmp_path: Path) -> None:
    out = tmp_path / "o"
    result = _serve("--models", "1", "--load", "0.02", "--policies", "static", "--out", str(out))
    assert result.exit_code == 0, result.output
    assert json.loads((out / "summary.json").read_text())["trace"] == "synthetic-azure-like"


@pytest.mark.parametrize(
    ("row", "fragments"),
    [
        ("2023-11-16 18:00:03,abc,5", [":5: ContextTokens:", "'abc'"]),
        ("2023-11-16 18:00:03,12", [":5: GeneratedTokens: missing"]),
        ("yesterday,12,5", [":5: TIMESTAMP:", "'yesterday'"]),
        ("2023-11-16 18:00:03,0,5", [":5: ContextTokens: must be 1.."]),
    ],
)
def test_a_malformed_trace_line_is_one_line_naming_file_line_and_field(
    tmp_path: Path, row: str, fragments: list[str]
) -> None:
    trace = _trace(tmp_path, bad=(3, row))
    out = tmp_path / "o"
    result = _serve("--trace", str(trace), "--out", str(out))
    assert_one_line_error(result, f"{trace}:5:", *fragments)
    assert not out.exists()  # nothing written, nothing run


def test_a_wrong_header_and_a_missing_file_are_one_line(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("time,prompt,output\n1,2,3\n")
    assert_one_line_error(_serve("--trace", str(trace), "--out", str(tmp_path / "o")), f"{trace}:1:", HEADER)
    missing = tmp_path / "absent.csv"
    assert_one_line_error(_serve("--trace", str(missing), "--out", str(tmp_path / "o")), str(missing))


@pytest.mark.parametrize("option", ["--setup", "--policies"])  # --policies: the older name, still taken
def test_an_unknown_setup_is_one_line_naming_the_known_ones(tmp_path: Path, option: str) -> None:
    out = tmp_path / "o"
    result = _serve("--trace", str(_trace(tmp_path)), option, "static,ray-serve", "--out", str(out))
    assert_one_line_error(result, "--setup", "'ray-serve'", "static, static-autoscale, tessera")
    assert not out.exists()


def test_a_bad_knob_is_one_line_naming_set(tmp_path: Path) -> None:
    out = tmp_path / "o"
    result = _serve("--trace", str(_trace(tmp_path)), "--set", "router=fastest", "--out", str(out))
    assert_one_line_error(result, "--set", "router", "'fastest'")
    assert not out.exists()


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (["--models", "0"], ["--models", "1..256"]),
        (["--zipf", "-1"], ["--zipf"]),
        (["--load", "0"], ["--load"]),
        (["--load", "250"], ["--load", "<= 100"]),
        (["--seeds", "3-1"], ["--seeds"]),
        (["--gpus", "64xH100", "--gpus-for-slo"], ["--gpus", "not both"]),
        (["--gpus", "8xQuantumGPU"], ["--gpus", "QuantumGPU"]),
        (["--gpus", "8xT4", "--models", "3"], ["--gpus", "does not fit", "T4"]),
        (["--perf-profile", "/nonexistent/p.csv"], ["--perf-profile", "/nonexistent/p.csv"]),
    ],
)
def test_bad_options_are_one_line_naming_the_option(tmp_path: Path, args: list[str], fragments: list[str]) -> None:
    result = _serve("--trace", str(_trace(tmp_path)), *args, "--out", str(tmp_path / "o"))
    assert_one_line_error(result, *fragments)


GQA_CONFIG = {
    "model_type": "qwen2",
    "num_hidden_layers": 28,
    "hidden_size": 3584,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "intermediate_size": 18944,
    "vocab_size": 152064,
    "torch_dtype": "bfloat16",
}
PROFILE = "kind,batch_size,tokens,kv_tokens,time_ms\nprefill,1,512,0,50\nprefill,2,1024,0,90\n"
PROFILE += "decode,1,,500,20\ndecode,8,,8000,24\ndecode,32,,32000,35\n"


def _config_json(folder: Path, drop: str | None = None) -> Path:
    path = folder / "config.json"
    path.write_text(json.dumps({k: v for k, v in GQA_CONFIG.items() if k != drop}))
    return path


def test_a_model_brought_by_its_config_and_one_by_its_profile_are_served(tmp_path: Path) -> None:
    profile = tmp_path / "profile.csv"
    profile.write_text(PROFILE)
    out = tmp_path / "o"
    args = ["--trace", str(_trace(tmp_path)), "--models", "3", "--policies", "static", "--out", str(out)]
    args += ["--model-mix", "qwen2-7b,bloom-176b", "--model-config", f"qwen2-7b={_config_json(tmp_path)}"]
    result = _serve(*args, "--model-profile", f"bloom-176b={profile}")
    assert result.exit_code == 0, result.output
    assert "qwen2-7b: 7.62B parameters" in result.stdout and "TP 1; architecture:" in result.stdout
    assert "bloom-176b: 176.20B parameters" in result.stdout and f"timing: profile {profile}" in result.stdout
    runs = (out / "summary.md").read_text()
    assert "m00-qwen2-7b" in runs and "m01-bloom-176b" in runs and "m02-qwen2-7b" in runs


def test_a_config_without_a_needed_key_is_one_line_naming_the_file_and_the_key(tmp_path: Path) -> None:
    config = _config_json(tmp_path, drop="num_attention_heads")
    out = tmp_path / "o"
    args = ["--trace", str(_trace(tmp_path)), "--model-mix", "mine", "--model-config", f"mine={config}"]
    result = _serve(*args, "--out", str(out))
    assert_one_line_error(result, f"{config}: num_attention_heads: missing")
    assert not out.exists()


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (["--model-mix", "mistral-7b"], ["--model-mix", "'mistral-7b'", "bloom-176b", "--model-config NAME="]),
        (["--model-config", "mine"], ["--model-config", "NAME=PATH"]),
        (["--model-config", "mine=/nonexistent/config.json"], ["--model-config", "/nonexistent/config.json"]),
        (["--model-profile", "/nonexistent/p.csv"], ["--model-profile", "/nonexistent/p.csv"]),
    ],
)
def test_unknown_models_and_bad_model_options_are_one_line(
    tmp_path: Path, args: list[str], fragments: list[str]
) -> None:
    result = _serve("--trace", str(_trace(tmp_path)), *args, "--out", str(tmp_path / "o"))
    assert_one_line_error(result, *fragments)


def test_a_profile_without_an_architecture_is_one_line_naming_what_is_missing(tmp_path: Path) -> None:
    profile = tmp_path / "profile.csv"
    profile.write_text(PROFILE)
    args = ["--trace", str(_trace(tmp_path)), "--model-mix", "mine", "--model-profile", f"mine={profile}"]
    result = _serve(*args, "--out", str(tmp_path / "o"))
    assert_one_line_error(result, "--model-profile", "timings only", "--model-config mine=config.json")
