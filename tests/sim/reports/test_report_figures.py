"""What the report figures show (issue 15, part 4): the FGD plot's zoomed panel and std bands, and the timeline
allocation plot's panels, time bins and makespan axis; the tables ``simulate timeline`` prints."""

from __future__ import annotations

import numpy as np
import pytest
from matplotlib.collections import FillBetweenPolyCollection, PolyCollection

from tessera.sim.placement_study.inflation import MAX_BUCKET, BucketCurves
from tessera.sim.placement_study.sweep import RunResult
from tessera.sim.replay.result import TimelineResult
from tessera.sim.reports.placement_study import unallocated_figure, zoom_region
from tessera.sim.reports.timeline import ALLOCATION_BINS, allocation_figure, binned_step_mean, summarize

BUCKETS = MAX_BUCKET + 1
HOUR = 3600.0


def _run(policy: str, seed: int, plateau: float) -> RunResult:
    """Unallocated falls 1 % per arrived % until it reaches ``plateau`` (at 100 - plateau), then stays there."""
    unallocated = np.maximum(100.0 - np.arange(BUCKETS, dtype=float), plateau)
    alloc = 100.0 - unallocated
    return RunResult(policy, seed, BucketCurves(alloc, alloc, alloc), 100.0, 10)


def test_the_fgd_plot_has_the_whole_run_and_a_zoom_on_where_the_policies_differ() -> None:
    results = [_run("bestfit", 1, 9.0), _run("bestfit", 2, 11.0), _run("fgd", 1, 4.0)]
    figure = unallocated_figure("tiny", results)
    whole, zoom = figure.axes
    assert whole.get_xlim() == (0, MAX_BUCKET)
    # The highest plateau with its std (bestfit: 10 + sqrt 2) makes the zoom 0..17.1 high; every curve is that low
    # from 83 % arrived, but the means part (by over 0.5) only at 91 % (bestfit 10, fgd 9): the zoom starts 3 before.
    assert zoom.get_xlim() == (91 - 3, MAX_BUCKET)
    assert zoom.get_ylim() == pytest.approx((0.0, 1.5 * (10 + np.sqrt(2))))
    # A band of ± 1 std for bestfit (two seeds) in each panel; none for fgd (one seed).
    for axes in (whole, zoom):
        bands = [c for c in axes.collections if isinstance(c, PolyCollection | FillBetweenPolyCollection)]
        assert len(bands) == 1
    legend = whole.get_legend()
    assert legend is not None and [t.get_text() for t in legend.get_texts()] == ["bestfit", "fgd"]


def test_with_policies_that_never_differ_the_zoom_shows_where_the_curve_settles() -> None:
    mean = np.maximum(100.0 - np.arange(BUCKETS, dtype=float), 5.0)
    (x0, x1), (y0, y1) = zoom_region({"only": (mean, np.zeros(BUCKETS))})
    assert (x1, y0, y1) == (MAX_BUCKET, 0.0, 7.5)
    assert x0 == 93 - 3  # where the curve comes down to 7.5 %: the region of the plateau


def _timeline(policy: str, finish_h: float) -> TimelineResult:
    arrivals = np.array([1 * HOUR, 2 * HOUR])
    finishes = np.array([3 * HOUR, finish_h * HOUR])
    # Allocation flips between 0 and 100 % every second for 2 h, then stays at 50 % until the last finish.
    flips = np.arange(1 * HOUR, 3 * HOUR, 1.0)
    times = np.concatenate((flips, [3 * HOUR, finish_h * HOUR]))
    alloc = np.concatenate((np.tile([100.0, 0.0], flips.size // 2), [50.0, 0.0]))
    return TimelineResult(policy, arrivals, arrivals, finishes, 50.0, 0, 0.0, times, alloc)


def test_the_allocation_plot_has_one_binned_panel_per_policy_and_ends_at_the_makespan() -> None:
    figure = allocation_figure("w", [_timeline("static", 9.0), _timeline("tessera", 6.0)])
    axes = figure.axes
    assert len(axes) == 2  # one panel per policy: no line drawn over another's
    assert axes[-1].get_xlim() == pytest.approx((0.0, 9.0 - 1.0))  # first arrival 1 h, last finish 9 h (in h)
    dashed = [np.asarray(line.get_xdata())[0] for axis in axes for line in axis.get_lines()]
    assert dashed == pytest.approx([8.0, 5.0])  # each policy's own makespan
    assert [t.get_text() for axis in axes for t in axis.texts] == ["static", "tessera"]


def test_binning_averages_the_step_function_over_time() -> None:
    times, values = np.array([0.0, 1.0, 3.0]), np.array([100.0, 0.0, 50.0])
    edges = np.array([0.0, 2.0, 4.0, 6.0])
    assert binned_step_mean(times, values, edges) == pytest.approx([50.0, 25.0, 50.0])
    flicker = _timeline("p", 9.0)
    edges = np.linspace(HOUR, 9 * HOUR, ALLOCATION_BINS + 1)
    mean = binned_step_mean(flicker.alloc_times_s, flicker.alloc_pct, edges)
    assert mean.shape == (ALLOCATION_BINS,)
    # The first 2 h (100 bins of 72 s) flip every second: they average out to about 50 %, not a solid band 0..100.
    assert np.all(np.abs(mean[:100] - 50.0) <= 1.0)
    assert np.all(mean[100:] == 50.0)


def test_simulate_timeline_tables_have_the_summary_columns() -> None:
    from rich.console import Console

    from tessera.cli.sim_tables import TIMELINE_COLUMNS, queue_table, timeline_table

    summaries = summarize([_timeline("static", 9.0), _timeline("tessera", 6.0)])
    table = timeline_table("w", "0", summaries)
    assert [c.header for c in table.columns] == list(TIMELINE_COLUMNS)
    assert TIMELINE_COLUMNS[:4] == ("policy", "avg JCT (h)", "p50 JCT (h)", "p99 JCT (h)")
    assert list(table.columns[0].cells) == ["static", "tessera"]
    assert list(table.columns[TIMELINE_COLUMNS.index("makespan (h)")].cells) == ["8.0", "5.0"]
    assert queue_table(summaries) is None  # no queues in these runs
    console = Console(width=200, record=True)
    console.print(table)
    assert "jobs / h" in console.export_text()
