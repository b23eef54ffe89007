"""Reports of the timeline simulator: ``summary.json``, ``summary.md``, ``jct_cdf.png``, ``allocation.png``.

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
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from tessera.sim.replay.result import TimelineResult  # noqa: E402


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
    figure, axis = plt.subplots(figsize=(8, 4.2))
    for result in _first_run_per_policy(results):
        if not result.alloc_times_s.size:
            continue
        days = (result.alloc_times_s - result.alloc_times_s[0]) / 86400.0
        axis.step(days, result.alloc_pct, where="post", label=result.policy, linewidth=0.8)
    axis.set(xlabel="time (days)", ylabel="allocated GPU (% of capacity)", title=f"GPU allocation: {workload}")
    _save(figure, axis, path)
