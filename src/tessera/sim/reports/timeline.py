"""Reports of the timeline simulator: ``summary.json``, ``summary.md``, ``jct_cdf.png``, ``allocation.png`` (one panel
per policy, time-binned, the axis ending at the makespan: ``allocation_figure``).

``summary.json`` is ``{"workload": str, "policies": {NAME: {"avg_jct_s", "p99_jct_s", "avg_wait_s", "p99_wait_s",
"gpu_alloc_pct", "preemptions", "jain_index", "p50_jct_s", "p50_wait_s", "makespan_s", "jobs_per_hour"}}}``, each
value the mean over seeds. ``makespan_s`` runs from the first arrival to the last finish of the jobs that ran, and
``jobs_per_hour`` (effective throughput) is the number of those jobs per hour of makespan. ``jain_index`` is Jain's
fairness index over queues of the GPU-seconds each queue received divided by its entitlement over its busy periods
(1.0 without queues). With queues, ``summary.md`` adds a table per policy and queue of received / entitled, the
number of reclaims, the longest reclaim latency and the longest time blocked by borrowers (the most over seeds).
Called by ``tessera simulate timeline``.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import numpy.typing as npt  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from tessera.sim.replay.result import TimelineResult  # noqa: E402

FloatArray = npt.NDArray[np.float64]
ALLOCATION_BINS = 400  # time bins of the allocation plot: about one per pixel column


@dataclass(frozen=True, slots=True)
class TimelineSummary:
    policy: str
    avg_jct_s: float
    p99_jct_s: float
    avg_wait_s: float
    p99_wait_s: float
    gpu_alloc_pct: float
    preemptions: int
    jain_index: float
    unfinished: int
    queue_shares: dict[str, float] = field(default_factory=dict)  # queue -> received / entitled, mean over seeds
    reclaims: int = 0
    reclaim_latency_max_s: float = 0.0
    blocked_by_borrowers_max_s: float = 0.0
    p50_jct_s: float = 0.0
    p50_wait_s: float = 0.0
    makespan_s: float = 0.0
    jobs_per_hour: float = 0.0

    def as_json(self) -> dict[str, float | int]:
        return {
            "avg_jct_s": round(self.avg_jct_s, 3),
            "p99_jct_s": round(self.p99_jct_s, 3),
            "avg_wait_s": round(self.avg_wait_s, 3),
            "p99_wait_s": round(self.p99_wait_s, 3),
            "gpu_alloc_pct": round(self.gpu_alloc_pct, 3),
            "preemptions": self.preemptions,
            "jain_index": round(self.jain_index, 4),
            "p50_jct_s": round(self.p50_jct_s, 3),
            "p50_wait_s": round(self.p50_wait_s, 3),
            "makespan_s": round(self.makespan_s, 3),
            "jobs_per_hour": round(self.jobs_per_hour, 4),
        }


def summarize(results: Sequence[TimelineResult]) -> list[TimelineSummary]:
    """One summary per policy (in first-seen order), averaging over the seeds' results."""
    by_policy: dict[str, list[TimelineResult]] = defaultdict(list)
    for result in results:
        by_policy[result.policy].append(result)
    summaries = []
    for policy, runs in by_policy.items():
        summaries.append(
            TimelineSummary(
                policy,
                _mean(float(r.jct_s.mean()) if r.jct_s.size else 0.0 for r in runs),
                _mean(float(np.percentile(r.jct_s, 99)) if r.jct_s.size else 0.0 for r in runs),
                _mean(float(r.wait_s.mean()) if r.wait_s.size else 0.0 for r in runs),
                _mean(float(np.percentile(r.wait_s, 99)) if r.wait_s.size else 0.0 for r in runs),
                _mean(r.gpu_alloc_pct for r in runs),
                round(_mean(float(r.preemptions) for r in runs)),
                _mean(r.jain_index for r in runs),
                round(_mean(float(r.unfinished) for r in runs)),
                {q: _mean(r.queue_shares.get(q, 0.0) for r in runs) for q in runs[0].queue_shares},
                round(_mean(float(r.reclaims) for r in runs)),
                max(r.reclaim_latency_max_s for r in runs),
                max(r.blocked_by_borrowers_max_s for r in runs),
                _mean(float(np.median(r.jct_s)) if r.jct_s.size else 0.0 for r in runs),
                _mean(float(np.median(r.wait_s)) if r.wait_s.size else 0.0 for r in runs),
                _mean(_makespan_s(r) for r in runs),
                _mean(_jobs_per_hour(r) for r in runs),
            )
        )
    return summaries


def write_timeline_report(out: Path, workload: str, results: Sequence[TimelineResult]) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    summaries = summarize(results)
    paths = [out / "summary.json", out / "summary.md", out / "jct_cdf.png", out / "allocation.png"]
    document = {"workload": workload, "policies": {s.policy: s.as_json() for s in summaries}}
    paths[0].write_text(json.dumps(document, indent=2) + "\n")
    paths[1].write_text(_markdown(workload, summaries))
    _plot_cdf(paths[2], workload, results)
    _plot_allocation(paths[3], workload, results)
    return paths


def _makespan_s(result: TimelineResult) -> float:
    """First arrival to last finish of the jobs that ran (0 when none did)."""
    if not result.finish_s.size:
        return 0.0
    return float(result.finish_s.max() - result.arrival_s.min())


def _jobs_per_hour(result: TimelineResult) -> float:
    """Jobs that ran per hour of makespan (0 when none did)."""
    makespan_s = _makespan_s(result)
    return result.jct_s.size / (makespan_s / 3600.0) if makespan_s > 0 else 0.0


def _mean(values: Iterable[float]) -> float:
    data = list(values)
    return float(np.mean(data)) if data else 0.0


def _markdown(workload: str, summaries: Sequence[TimelineSummary]) -> str:
    lines = [
        f"# Timeline simulation: {workload}",
        "",
        "| policy | avg JCT (h) | p50 JCT (h) | p99 JCT (h) | avg wait (h) | p50 wait (h) | p99 wait (h) "
        "| GPU alloc % | jobs / h | makespan (h) | preemptions | Jain | never ran |",
        "|---|" + "---:|" * 12,
    ]
    for s in summaries:
        lines.append(
            f"| {s.policy} | {s.avg_jct_s / 3600:.2f} | {s.p50_jct_s / 3600:.2f} | {s.p99_jct_s / 3600:.2f} "
            f"| {s.avg_wait_s / 3600:.2f} | {s.p50_wait_s / 3600:.2f} | {s.p99_wait_s / 3600:.2f} "
            f"| {s.gpu_alloc_pct:.1f} | {s.jobs_per_hour:.2f} | {s.makespan_s / 3600:.1f} | {s.preemptions} "
            f"| {s.jain_index:.3f} | {s.unfinished} |"
        )
    return "\n".join(lines + _queue_table(summaries)) + "\n"


def _queue_table(summaries: Sequence[TimelineSummary]) -> list[str]:
    queues = sorted({q for s in summaries for q in s.queue_shares})
    if not queues:
        return []
    lines = [
        "",
        "Share of entitlement received per queue (time-weighted over its busy periods; entitlement = nominal quota",
        "plus fair share of idle capacity), reclaims of borrowed capacity, the longest reclaim latency (a reclaim",
        "that would let the owner run was not made) and the longest time quota-fitting work waited while others",
        "borrow (whatever else kept it waiting):",
        "",
        "| policy | " + " | ".join(queues) + " | reclaims | max reclaim latency (s) | max blocked by borrowers (s) |",
        "|---|" + "---:|" * (len(queues) + 3),
    ]
    for s in summaries:
        shares = " | ".join(f"{100 * s.queue_shares.get(q, 0.0):.1f}%" for q in queues)
        latency = f"{s.reclaim_latency_max_s:.1f} | {s.blocked_by_borrowers_max_s:.1f}"
        lines.append(f"| {s.policy} | {shares} | {s.reclaims} | {latency} |")
    return lines


def _first_run_per_policy(results: Sequence[TimelineResult]) -> list[TimelineResult]:
    """The plots show one run (the first seed) per policy."""
    first: dict[str, TimelineResult] = {}
    for result in results:
        first.setdefault(result.policy, result)
    return list(first.values())


def _save(figure: Figure, axis: Axes, path: Path) -> None:
    axis.grid(alpha=0.3)
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _plot_cdf(path: Path, workload: str, results: Sequence[TimelineResult]) -> None:
    figure, axis = plt.subplots(figsize=(7, 4.2))
    for result in _first_run_per_policy(results):
        if not result.jct_s.size:
            continue
        jct_h = np.sort(result.jct_s) / 3600.0
        axis.plot(np.maximum(jct_h, 1e-3), np.arange(1, jct_h.size + 1) / jct_h.size, label=result.policy)
    axis.set(
        xscale="log",
        xlabel="job completion time (h, log scale)",
        ylabel="fraction of jobs",
        title=f"JCT CDF: {workload}",
    )
    _save(figure, axis, path)


def _plot_allocation(path: Path, workload: str, results: Sequence[TimelineResult]) -> None:
    figure = allocation_figure(workload, results)
    figure.savefig(path, dpi=110)
    plt.close(figure)


def allocation_figure(workload: str, results: Sequence[TimelineResult]) -> Figure:
    """Allocated GPU % over time, one panel per policy (first seed) on a shared time axis, so that no policy's line
    is drawn over another's. Each panel shows the time-weighted mean over ``ALLOCATION_BINS`` bins of the makespan
    (a step line of every change would be a solid band); the axis ends at the longest makespan (first arrival to
    last finish), and a dashed line marks each policy's own."""
    runs = [r for r in _first_run_per_policy(results) if r.alloc_times_s.size]
    longest_s = max((_makespan_s(r) for r in runs), default=0.0)
    scale, unit = (86400.0, "days") if longest_s > 2 * 86400 else (3600.0, "h")
    figure, axes = plt.subplots(
        max(1, len(runs)), 1, figsize=(8, 1.1 + 1.5 * max(1, len(runs))), sharex=True, sharey=True, squeeze=False
    )
    for i, (axis, run) in enumerate(zip(axes[:, 0], runs, strict=False)):
        color = f"C{i}"
        start_s = float(run.arrival_s.min()) if run.arrival_s.size else float(run.alloc_times_s[0])
        makespan_s = _makespan_s(run) or float(run.alloc_times_s[-1] - start_s)
        edges = np.linspace(start_s, start_s + max(makespan_s, 1.0), ALLOCATION_BINS + 1)
        mean = binned_step_mean(run.alloc_times_s, run.alloc_pct, edges)
        x = (edges - start_s) / scale
        axis.stairs(mean, x, fill=True, alpha=0.3, color=color)
        axis.stairs(mean, x, linewidth=1.0, color=color)
        axis.axvline(makespan_s / scale, color="0.3", linestyle="--", linewidth=0.8)
        label = {"facecolor": "white", "alpha": 0.8, "edgecolor": "none", "pad": 1.5}
        axis.text(0.005, 0.95, run.policy, transform=axis.transAxes, va="top", fontweight="bold", bbox=label)
        axis.set_ylim(0, 100)
        axis.grid(alpha=0.3)
    axes[-1, 0].set_xlim(0, max(longest_s, 1.0) / scale)
    axes[-1, 0].set_xlabel(f"time since the first arrival ({unit}); dashed: the policy's makespan")
    figure.supylabel("allocated GPU (% of capacity)")
    figure.suptitle(f"GPU allocation: {workload}")
    figure.tight_layout()
    return figure


def binned_step_mean(times_s: FloatArray, values: FloatArray, edges_s: FloatArray) -> FloatArray:
    """The time-weighted mean in each bin between ``edges_s`` of the step function that is ``values[i]`` from
    ``times_s[i]`` on (0 before the first time)."""
    durations = np.diff(times_s, append=max(float(times_s[-1]), float(edges_s[-1])))
    area = np.concatenate(([0.0], np.cumsum(values * durations)))
    at = np.concatenate((times_s, [times_s[-1] + durations[-1]]))
    integral = np.interp(edges_s, at, area, left=0.0)
    widths = np.diff(edges_s)
    return np.where(widths > 0, np.diff(integral) / np.where(widths > 0, widths, 1.0), 0.0)
