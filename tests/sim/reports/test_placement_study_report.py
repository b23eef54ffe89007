"""Report files of an arrival-inflation sweep (tessera.sim.reports.placement_study), on hand-made curves."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np
import pytest

from tessera.sim.placement_study.inflation import MAX_BUCKET, BucketCurves
from tessera.sim.placement_study.sweep import RunResult
from tessera.sim.reports.placement_study import format_mean_std, format_seeds, summarize, write_report

BUCKETS = MAX_BUCKET + 1


def _curves(alloc_at_100: float, alloc_at_130: float, gap: int | None = None) -> BucketCurves:
    alloc = np.linspace(0.0, 95.0, BUCKETS)
    alloc[100], alloc[130] = alloc_at_100, alloc_at_130
    frag = np.full(BUCKETS, 3.14159)
    ratio = np.full(BUCKETS, 20.0)
    if gap is not None:
        alloc[gap] = frag[gap] = ratio[gap] = np.nan
    return BucketCurves(alloc, frag, ratio)


def _results() -> list[RunResult]:
    return [
        RunResult("bestfit", 1, _curves(90.0, 91.0), 1000.0, 500),
        RunResult("bestfit", 2, _curves(92.0, 93.0, gap=5), 3000.0, 510),
        RunResult("fgd", 1, _curves(95.0, 96.0), 400.0, 500),
    ]


def test_summary_means_and_sample_std_over_seeds() -> None:
    bestfit, fgd = summarize(_results())
    assert bestfit.policy == "bestfit"
    assert bestfit.unallocated_pct == {100: pytest.approx(9.0), 130: pytest.approx(8.0)}
    assert bestfit.unallocated_pct_std[100] == pytest.approx(math.sqrt(2.0))  # ddof=1 of (10, 8)
    assert bestfit.pods_per_s == pytest.approx(2000.0)
    assert fgd.unallocated_pct_std == {100: 0.0, 130: 0.0}  # one seed


def test_write_report_writes_the_four_files(tmp_path: Path) -> None:
    files = write_report(tmp_path / "out", "tiny", 64, [1, 2], _results())
    assert all(path.is_file() for path in files.all())

    summary = json.loads(files.summary_json.read_text())
    assert summary == {
        "trace": "tiny",
        "gpus": 64,
        "seeds": [1, 2],
        "policies": {
            "bestfit": {
                "unallocated_pct": {"100": pytest.approx(9.0), "130": pytest.approx(8.0)},
                "unallocated_pct_std": {"100": pytest.approx(math.sqrt(2.0), abs=1e-4), "130": pytest.approx(1.4142)},
                "pods_per_s": pytest.approx(2000.0),
            },
            "fgd": {
                "unallocated_pct": {"100": pytest.approx(5.0), "130": pytest.approx(4.0)},
                "unallocated_pct_std": {"100": 0.0, "130": 0.0},
                "pods_per_s": pytest.approx(400.0),
            },
        },
    }
    assert files.plot_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_runs_csv_rows_rounding_and_gaps(tmp_path: Path) -> None:
    files = write_report(tmp_path, "tiny", 64, [1, 2], _results())
    with files.runs_csv.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert list(rows[0]) == ["policy", "seed", "arrived_pct", "alloc_pct", "frag_pct", "frag_ratio_pct"]
    assert len(rows) == 3 * BUCKETS
    assert [r["arrived_pct"] for r in rows[:BUCKETS]] == [str(b) for b in range(BUCKETS)]
    assert rows[0]["frag_pct"] == "3.14"
    gap = rows[BUCKETS + 5]
    assert (gap["policy"], gap["seed"], gap["arrived_pct"]) == ("bestfit", "2", "5")
    assert gap["alloc_pct"] == gap["frag_pct"] == gap["frag_ratio_pct"] == ""


def test_summary_markdown_table(tmp_path: Path) -> None:
    files = write_report(tmp_path, "tiny", 64, [1, 2], _results())
    text = files.summary_md.read_text()
    assert "`tiny`" in text and "64 GPUs" in text and "seeds 1-2" in text
    assert "| bestfit | 9.00 ± 1.41 | 8.00 ± 1.41 | 2,000 |" in text
    assert "| fgd | 5.00 ± 0.00 | 4.00 ± 0.00 | 400 |" in text


def test_a_bucket_no_run_reached_is_null_in_json(tmp_path: Path) -> None:
    curves = _curves(90.0, 91.0, gap=130)
    files = write_report(tmp_path, "tiny", 64, [1], [RunResult("fgd", 1, curves, 10.0, 5)])
    figures = json.loads(files.summary_json.read_text())["policies"]["fgd"]
    assert figures["unallocated_pct"]["130"] is None
    assert figures["unallocated_pct"]["100"] == pytest.approx(10.0)


def test_formatting_helpers() -> None:
    assert format_seeds([42, 43, 44]) == "42-44"
    assert format_seeds([42, 50]) == "42,50"
    assert format_seeds([7]) == "7"
    assert format_mean_std(4.771, 0.256) == "4.77 ± 0.26"
    assert format_mean_std(math.nan, math.nan) == "n/a"
