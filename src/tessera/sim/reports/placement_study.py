"""Reports of an arrival-inflation sweep: per-bucket curves, a summary (JSON and Markdown) and a plot.

``write_report`` is called by the CLI (``tessera simulate fgd``) after ``run_sweep``; ``summarize`` gives the same
per-policy figures to callers that print them (the CLI's table). Files written into the output folder:

- ``runs.csv``: policy, seed, arrived_pct (bucket 0..130), alloc_pct, frag_pct, frag_ratio_pct; one row per run
  and bucket, values rounded to 2 decimals, empty where a bucket has no sample;
- ``summary.json``: ``{"trace", "gpus", "seeds", "policies": {NAME: {"unallocated_pct": {"100", "130"},
  "unallocated_pct_std": {"100", "130"}, "pods_per_s"}}}`` (means over seeds; sample std, 0.0 for one seed;
  ``null`` only where no run reached that bucket);
- ``summary.md``: the same figures as a Markdown table;
- ``unallocated.png``: unallocated GPU % (100 - allocation %) against arrived %, mean over seeds with a band of ± one
  sample std, one line per policy: the whole run, and a zoomed panel where the policies differ (``zoom_region``).
"""

from __future__ import annotations

import csv
import json
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from tessera.sim.placement_study.inflation import MAX_BUCKET
from tessera.sim.placement_study.sweep import RunResult

if TYPE_CHECKING:
    from matplotlib.figure import Figure
    from matplotlib.patches import Rectangle

FloatArray = npt.NDArray[np.float64]
FULL_BUCKET = 100  # arrived % at which the cluster's capacity has been asked for
ZOOM_SPREAD_PCT = 0.5  # policies "differ" once their mean unallocated % are this far apart
REPORT_BUCKETS: tuple[int, ...] = (100, 130)  # arrived % at which the summary reads the unallocated %
RUNS_COLUMNS: tuple[str, ...] = ("policy", "seed", "arrived_pct", "alloc_pct", "frag_pct", "frag_ratio_pct")


@dataclass(frozen=True, slots=True)
class PolicySummary:
    policy: str
    unallocated_pct: dict[int, float]  # bucket -> mean over seeds (NaN when no run reached the bucket)
    unallocated_pct_std: dict[int, float]  # bucket -> sample std over seeds (0.0 for a single seed)
    pods_per_s: float  # mean over seeds


@dataclass(frozen=True, slots=True)
class ReportFiles:
    runs_csv: Path
    summary_json: Path
    summary_md: Path
    plot_png: Path

    def all(self) -> tuple[Path, ...]:
        return (self.runs_csv, self.summary_json, self.summary_md, self.plot_png)


def summarize(results: Sequence[RunResult]) -> list[PolicySummary]:
    """Per-policy means and standard deviations over seeds, in the order the policies first appear."""
    summaries = []
    for policy in _policies_in_order(results):
        runs = [r for r in results if r.policy == policy]
        means: dict[int, float] = {}
        stds: dict[int, float] = {}
        for bucket in REPORT_BUCKETS:
            values = np.array([r.curves.unallocated_pct(bucket) for r in runs])
            means[bucket], stds[bucket] = _mean_std(values)
        pods_per_s = float(np.mean([r.pods_per_s for r in runs]))
        summaries.append(PolicySummary(policy, means, stds, pods_per_s))
    return summaries


def write_report(
    out_dir: Path, trace: str, gpus: int, seeds: Sequence[int], results: Sequence[RunResult], inflate: float = 1.3
) -> ReportFiles:
    """Write the four report files into ``out_dir`` (created if needed) and return their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    files = ReportFiles(
        out_dir / "runs.csv", out_dir / "summary.json", out_dir / "summary.md", out_dir / "unallocated.png"
    )
    summaries = summarize(results)
    write_runs_csv(files.runs_csv, results)
    files.summary_json.write_text(summary_json(trace, gpus, seeds, summaries) + "\n", encoding="utf-8")
    files.summary_md.write_text(summary_markdown(trace, gpus, seeds, summaries, inflate), encoding="utf-8")
    plot_unallocated(files.plot_png, trace, results)
    return files


def write_runs_csv(path: Path, results: Sequence[RunResult]) -> None:
    with path.open("w", encoding="utf-8", newline="") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(RUNS_COLUMNS)
        for r in results:
            curves = (r.curves.alloc_pct, r.curves.frag_pct, r.curves.frag_ratio_pct)
            for bucket in range(MAX_BUCKET + 1):
                writer.writerow([r.policy, r.seed, bucket, *(_cell(float(c[bucket])) for c in curves)])


def summary_json(trace: str, gpus: int, seeds: Sequence[int], summaries: Sequence[PolicySummary]) -> str:
    document = {
        "trace": trace,
        "gpus": int(gpus),
        "seeds": [int(s) for s in seeds],
        "policies": {
            s.policy: {
                "unallocated_pct": {str(b): _json_float(s.unallocated_pct[b]) for b in REPORT_BUCKETS},
                "unallocated_pct_std": {str(b): _json_float(s.unallocated_pct_std[b]) for b in REPORT_BUCKETS},
                "pods_per_s": _json_float(s.pods_per_s),
            }
            for s in summaries
        },
    }
    return json.dumps(document, indent=2, allow_nan=False)


def summary_markdown(
    trace: str, gpus: int, seeds: Sequence[int], summaries: Sequence[PolicySummary], inflate: float = 1.3
) -> str:
    lines = [
        "# Arrival-inflation study",
        "",
        f"Trace `{trace}`, {gpus:,} GPUs, seeds {format_seeds(seeds)} ({len(seeds)}), inflation {inflate:g}x.",
        "Unallocated GPU % (100 - allocation %) when the arrived GPU request reaches 100% and 130% of capacity;",
        "mean ± sample std over seeds.",
        "",
        "| policy | unallocated % @ arrived 100% | unallocated % @ arrived 130% | pods/s |",
        "|---|---:|---:|---:|",
    ]
    for s in summaries:
        cells = [format_mean_std(s.unallocated_pct[b], s.unallocated_pct_std[b]) for b in REPORT_BUCKETS]
        lines.append(f"| {s.policy} | {cells[0]} | {cells[1]} | {s.pods_per_s:,.0f} |")
    return "\n".join(lines) + "\n"


def plot_unallocated(path: Path, trace: str, results: Sequence[RunResult]) -> None:
    """``unallocated_figure`` saved as a PNG; drawn off-screen with Agg."""
    unallocated_figure(trace, results).savefig(path)


def unallocated_figure(trace: str, results: Sequence[RunResult]) -> Figure:
    """Unallocated % against arrived %, one line per policy (mean over seeds, a band of ± one sample std where
    there are several seeds): the whole run on the left, and on the right the region where the policies differ
    (``zoom_region``), where the lines that overlap on the left are told apart."""
    # Imported here: matplotlib is slow to import and only the plot needs it.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(12, 5), dpi=110)
    FigureCanvasAgg(figure)
    whole, zoom = figure.subplots(1, 2, gridspec_kw={"width_ratios": (1, 1.2)})
    arrived = np.arange(MAX_BUCKET + 1)
    curves = _unallocated_curves(results)
    for policy, (mean, std) in curves.items():
        for axes in (whole, zoom):
            (line,) = axes.plot(arrived, mean, label=policy, linewidth=1.6)
            if np.any(std > 0):
                axes.fill_between(arrived, mean - std, mean + std, color=line.get_color(), alpha=0.2, linewidth=0)
    (x0, x1), (y0, y1) = zoom_region(curves)
    whole.set_xlim(0, MAX_BUCKET)
    whole.set_ylim(bottom=0)
    whole.add_patch(_rectangle(x0, y0, x1 - x0, y1 - y0))
    whole.set_title("whole run")
    zoom.set_xlim(x0, x1)
    zoom.set_ylim(y0, y1)
    zoom.set_title(f"zoom: arrived {x0}-{x1} % (band: ± 1 std over seeds)")
    for axes in (whole, zoom):
        axes.set_xlabel("arrived GPU request (% of cluster GPU capacity)")
        axes.grid(True, alpha=0.3)
    whole.set_ylabel("unallocated GPU (% of capacity)")
    whole.legend(title="policy", loc="upper right")
    figure.suptitle(f"Unallocated GPU vs arrived workload: {trace}")
    figure.tight_layout()
    return figure


def zoom_region(curves: dict[str, tuple[FloatArray, FloatArray]]) -> tuple[tuple[int, int], tuple[float, float]]:
    """The part of the plot that tells policies apart. Vertically, from 0 to half again the highest unallocated %
    (mean + std) any policy ends on at 100 % arrived or later; horizontally, to the last bucket from a little before
    the later of two arrived %: where the mean curves first differ by more than ``ZOOM_SPREAD_PCT`` and where every
    curve has come down into that height (at most ``FULL_BUCKET - 10``)."""
    means = np.array([mean for mean, _ in curves.values()])
    tops = np.array([mean + std for mean, std in curves.values()])
    settled = tops[:, FULL_BUCKET:]
    top = float(np.nanmax(settled)) if np.isfinite(settled).any() else 100.0
    y1 = min(100.0, max(1.0, 1.5 * top))
    with warnings.catch_warnings():  # a bucket no run reached is NaN for every policy
        warnings.simplefilter("ignore", RuntimeWarning)
        highest = np.nanmax(means, axis=0)
        spread = highest - np.nanmin(means, axis=0)
    inside = np.flatnonzero(highest <= y1)
    apart = np.flatnonzero(spread > ZOOM_SPREAD_PCT)
    start = max(int(apart[0]) if apart.size else 0, int(inside[0]) if inside.size else 0)
    x0 = max(0, min(start - 3, FULL_BUCKET - 10))
    return (x0, MAX_BUCKET), (0.0, y1)


def _unallocated_curves(results: Sequence[RunResult]) -> dict[str, tuple[FloatArray, FloatArray]]:
    """Policy -> (mean, sample std) of the unallocated % per bucket over its seeds (std 0 for one seed)."""
    curves = {}
    for policy in _policies_in_order(results):
        unallocated = 100.0 - np.array([r.curves.alloc_pct for r in results if r.policy == policy])
        counts = (~np.isnan(unallocated)).sum(axis=0)
        mean = _nanmean_rows(unallocated)
        std = np.zeros_like(mean)
        several = counts > 1
        if several.any():
            squares = np.nansum((unallocated - mean) ** 2, axis=0)
            std[several] = np.sqrt(squares[several] / (counts[several] - 1))
        curves[policy] = (mean, std)
    return curves


def _rectangle(x: float, y: float, width: float, height: float) -> Rectangle:
    from matplotlib.patches import Rectangle

    return Rectangle((x, y), width, height, fill=False, linestyle="--", linewidth=1.0, edgecolor="0.4")


def format_seeds(seeds: Sequence[int]) -> str:
    """``42-51`` for a contiguous ascending run, else the comma-separated list."""
    if len(seeds) > 1 and list(seeds) == list(range(seeds[0], seeds[0] + len(seeds))):
        return f"{seeds[0]}-{seeds[-1]}"
    return ",".join(str(s) for s in seeds)


def format_mean_std(mean: float, std: float) -> str:
    if math.isnan(mean):
        return "n/a"
    return f"{mean:.2f} ± {std:.2f}"


def _policies_in_order(results: Sequence[RunResult]) -> list[str]:
    return list(dict.fromkeys(r.policy for r in results))


def _mean_std(values: npt.NDArray[np.float64]) -> tuple[float, float]:
    """Mean and sample std (ddof=1; 0.0 for one value) of the non-NaN values; NaN when there are none."""
    valid = values[~np.isnan(values)]
    if valid.size == 0:
        return math.nan, math.nan
    std = float(np.std(valid, ddof=1)) if valid.size > 1 else 0.0
    return float(np.mean(valid)), std


def _nanmean_rows(rows: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """Column means ignoring NaN; NaN (a gap in the line) where a column has no value."""
    counts = (~np.isnan(rows)).sum(axis=0)
    sums = np.nansum(rows, axis=0)
    means = np.full(rows.shape[1], np.nan)
    np.divide(sums, counts, out=means, where=counts > 0)
    return means


def _cell(value: float) -> str:
    return "" if math.isnan(value) else f"{value:.2f}"


def _json_float(value: float) -> float | None:
    return None if math.isnan(value) else round(float(value), 4)
