"""The tables ``tessera simulate timeline`` prints (rich), with the figures of its ``summary.md``: one row per policy,
and with queues a second table of each queue's share of its entitlement and the reclaims."""

from __future__ import annotations

from collections.abc import Sequence

from rich.markup import escape
from rich.table import Table

from tessera.sim.reports.timeline import TimelineSummary

TIMELINE_COLUMNS = (
    "policy",
    "avg JCT (h)",
    "p50 JCT (h)",
    "p99 JCT (h)",
    "avg wait (h)",
    "p99 wait (h)",
    "GPU alloc %",
    "jobs / h",
    "makespan (h)",
    "preemptions",
    "Jain",
    "never ran",
)


def timeline_table(workload: str, seeds: str, summaries: Sequence[TimelineSummary]) -> Table:
    table = Table(title=f"{escape(workload)}: seeds {seeds} (mean over seeds)", title_justify="left")
    for name in TIMELINE_COLUMNS:
        table.add_column(
            name, style="bold" if name == "policy" else None, justify="left" if name == "policy" else "right"
        )
    hours = 3600.0
    for s in summaries:
        table.add_row(
            s.policy,
            f"{s.avg_jct_s / hours:.2f}",
            f"{s.p50_jct_s / hours:.2f}",
            f"{s.p99_jct_s / hours:.2f}",
            f"{s.avg_wait_s / hours:.2f}",
            f"{s.p99_wait_s / hours:.2f}",
            f"{s.gpu_alloc_pct:.1f}",
            f"{s.jobs_per_hour:.2f}",
            f"{s.makespan_s / hours:.1f}",
            str(s.preemptions),
            f"{s.jain_index:.3f}",
            str(s.unfinished),
        )
    return table


def queue_table(summaries: Sequence[TimelineSummary]) -> Table | None:
    """Per policy, each queue's received / entitled GPU share, reclaims and the longest reclaim latency and time
    blocked by borrowers (the most over seeds); None without queues."""
    queues = sorted({q for s in summaries for q in s.queue_shares})
    if not queues:
        return None
    table = Table(title="share of entitlement received per queue, and reclaims", title_justify="left")
    table.add_column("policy", style="bold")
    for name in [*queues, "reclaims", "max reclaim latency (s)", "max blocked by borrowers (s)"]:
        table.add_column(escape(name), justify="right")
    for s in summaries:
        shares = [f"{100 * s.queue_shares.get(q, 0.0):.1f}%" for q in queues]
        latency = [f"{s.reclaim_latency_max_s:.1f}", f"{s.blocked_by_borrowers_max_s:.1f}"]
        table.add_row(s.policy, *shares, str(s.reclaims), *latency)
    return table
