"""The serving study's report: the files, summary.json's exact schema and types, and the Markdown tables."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from tessera.sim.serving.config import StudyConfig
from tessera.sim.serving.report import SUMMARY_KEYS, write_serving_report
from tessera.sim.serving.result import ModelOutcome, PolicyRun

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
INT_KEYS = {"peak_gpus", "requests", "dropped", "cold_starts"}


def _run(policy: str, seed: int, gpu_hours: float, worst_a: float, series: bool = True) -> PolicyRun:
    """A hand-made run: two models, ``m00`` meeting 100% and ``m01`` meeting ``worst_a`` %."""
    times = np.arange(0.0, 600.0, 60.0) if series else np.zeros(0)
    met = round(worst_a * 2)  # of 200 requests
    return PolicyRun(
        policy=policy,
        seed=seed,
        gpus=16,
        gpu_hours=gpu_hours,
        peak_gpus=4 + seed,
        requests=1000,
        dropped=seed,
        cold_starts=2,
        slo_attainment_pct=99.0,
        worst_model_slo_attainment_pct=min(100.0, worst_a),
        ttft_p99_s=1.5,
        tpot_p99_s=0.1,
        sim_wall_s=0.5,
        models=(
            ModelOutcome("m00-llama2-13b", 800, 800, 0, 800, 1.0, 0.1),
            ModelOutcome("m01-llama3-8b", 200, 200, 0, met, 1.2, 0.1),
        ),
        times_s=times,
        gpus_in_use=np.full(times.size, 3.0),
        arrival_rate=np.linspace(1.0, 5.0, times.size),
        ttft_s=np.linspace(0.01, 3.0, 50) if series else np.zeros(0),
    )


@pytest.fixture
def config() -> StudyConfig:
    return StudyConfig(models=2, zipf=1.2, load=5.0, policies=("static", "tessera"), seeds=(0, 1))


@pytest.fixture
def runs() -> list[PolicyRun]:
    # Out of order on purpose: the report groups by the config's policy order and sorts seeds.
    return [_run("tessera", 1, 2.0, 97.5), _run("static", 0, 10.0, 99.5), _run("tessera", 0, 4.0, 100.0),
            _run("static", 1, 12.0, 98.0)]  # fmt: skip


def test_writes_the_files(tmp_path: Path, config: StudyConfig, runs: list[PolicyRun]) -> None:
    out = tmp_path / "deep" / "report"
    paths = write_serving_report(out, config, "conv", runs)

    assert [p.name for p in paths] == ["summary.json", "summary.md", "runs.csv", "gpus.png", "ttft_cdf.png"]
    assert all(p.parent == out and p.is_file() for p in paths)
    for png in paths[3:]:
        assert png.read_bytes()[:8] == PNG_MAGIC


def test_summary_json_has_the_issues_schema(tmp_path: Path, config: StudyConfig, runs: list[PolicyRun]) -> None:
    write_serving_report(tmp_path, config, "conv", runs)
    document = json.loads((tmp_path / "summary.json").read_text())

    assert list(document) == ["trace", "models", "seeds", "policies"]
    assert document["trace"] == "conv"
    assert document["models"] == 2
    assert document["seeds"] == [0, 1]
    assert list(document["policies"]) == ["static", "tessera"]
    for entry in document["policies"].values():
        assert set(entry) == set(SUMMARY_KEYS)
        for key, value in entry.items():
            assert isinstance(value, int if key in INT_KEYS else float), (key, value)
    static, tessera = document["policies"]["static"], document["policies"]["tessera"]
    assert static["gpu_hours"] == pytest.approx(11.0)  # the mean over seeds
    assert tessera["gpu_hours"] == pytest.approx(3.0)
    assert static["peak_gpus"] == 5  # the worst seed
    assert tessera["worst_model_slo_attainment_pct"] == pytest.approx(97.5)
    assert static["dropped"] == 1  # the total over seeds


def test_summary_md_has_a_row_per_policy_and_each_models_worst_attainment(
    tmp_path: Path, config: StudyConfig, runs: list[PolicyRun]
) -> None:
    write_serving_report(tmp_path, config, "conv", runs)
    text = (tmp_path / "summary.md").read_text()

    assert text.startswith("# Serving study: conv\n")
    assert "2 models, Zipf 1.2, load 5x, seeds 0, 1" in text
    assert "| static | 11.000 | 5 |" in text
    assert "| tessera | 3.000 | 5 |" in text
    # m01's worst over seeds: 98.0 under static, 97.5 under tessera; m00 always meets 100%.
    assert "| m01-llama3-8b | 98.00 | 97.50 |" in text
    assert "| m00-llama2-13b | 100.00 | 100.00 |" in text


def test_runs_csv_has_one_row_per_policy_and_seed(tmp_path: Path, config: StudyConfig, runs: list[PolicyRun]) -> None:
    write_serving_report(tmp_path, config, "conv", runs)
    with (tmp_path / "runs.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert sorted((r["policy"], r["seed"]) for r in rows) == [("static", "0"), ("static", "1"), ("tessera", "0"),
                                                              ("tessera", "1")]  # fmt: skip
    assert {r["gpu_hours"] for r in rows if r["policy"] == "static"} == {"10.0", "12.0"}


def test_runs_without_time_series_still_plot(tmp_path: Path, config: StudyConfig) -> None:
    runs = [_run("static", 0, 1.0, 100.0, series=False), _run("tessera", 0, 1.0, 100.0, series=False)]
    paths = write_serving_report(tmp_path, config, "conv", runs)
    assert all(p.stat().st_size > 0 for p in paths)


def test_no_runs_is_an_error(tmp_path: Path, config: StudyConfig) -> None:
    with pytest.raises(ValueError, match="no runs"):
        write_serving_report(tmp_path, config, "conv", [])
