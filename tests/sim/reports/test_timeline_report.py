"""The timeline report's figures: medians, makespan and jobs per hour, averaged over seeds, in JSON and markdown."""

import json
from pathlib import Path

import numpy as np
import pytest

from tessera.sim.replay.result import TimelineResult
from tessera.sim.reports.timeline import summarize, write_timeline_report


def result(arrivals: list[float], starts: list[float], finishes: list[float]) -> TimelineResult:
    times, alloc = np.array([0.0, finishes[-1]]), np.array([50.0, 0.0])
    return TimelineResult("p", np.array(arrivals), np.array(starts), np.array(finishes), 50.0, 0, 0.0, times, alloc)


def test_medians_makespan_and_jobs_per_hour_are_averaged_over_seeds(tmp_path: Path) -> None:
    # Seed A: JCTs 1, 2, 6 h; makespan 0..7 h -> 3 jobs / 7 h. Seed B: JCTs 2, 2 h; makespan 1..3 h -> 1 job / h.
    hour = 3600.0
    a = result([0.0, 0.0, 1 * hour], [0.0, 0.0, 2 * hour], [1 * hour, 2 * hour, 7 * hour])
    b = result([1 * hour, 1 * hour], [1 * hour, 2 * hour], [3 * hour, 3 * hour])
    (summary,) = summarize([a, b])
    assert summary.p50_jct_s == pytest.approx((2 * hour + 2 * hour) / 2)
    assert summary.p50_wait_s == pytest.approx((0.0 + 0.5 * hour) / 2)
    assert summary.makespan_s == pytest.approx((7 * hour + 2 * hour) / 2)
    assert summary.jobs_per_hour == pytest.approx((3 / 7 + 2 / 2) / 2)
    write_timeline_report(tmp_path, "w", [a, b])
    figures = json.loads((tmp_path / "summary.json").read_text())["policies"]["p"]
    assert figures["makespan_s"] == pytest.approx(4.5 * hour) and figures["p50_jct_s"] == pytest.approx(2 * hour)
    # avg JCT is the mean of the seeds' means (3 h, 2 h); then p50; ... jobs / h and makespan (h).
    row = (tmp_path / "summary.md").read_text().splitlines()[-1]
    assert row.startswith("| p | 2.50 | 2.00 |") and "| 0.71 | 4.5 |" in row
