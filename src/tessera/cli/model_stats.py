"""What ``tessera models stats NAME`` prints: a model's requests over the last few minutes against its SLO class's
targets, its replicas now and its setup, from ``GET /v1/models/NAME/stats`` (``tessera.api.serving_stats``)."""

from __future__ import annotations

from typing import Any


def seconds(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"


def minutes(window_s: float) -> str:
    return f"{window_s / 60:g} min" if window_s >= 60 else f"{window_s:g} s"


def stats_lines(out: dict[str, Any]) -> list[str]:
    """The lines, plain text (a figure over its target is marked ``!``)."""
    setup, targets, w = out["setup"], out["targets"], out["window"]
    chosen = [f"router {setup['router']}", f"SLO {setup['slo']}"]
    if setup.get("serving_setup"):
        chosen.insert(0, f"setup {setup['serving_setup']}")
    if setup.get("autoscaler"):
        chosen.append(f"autoscaler {setup['autoscaler']}")
    ttft, tpot = targets["ttft_s"], targets["tpot_s"]
    head = f"{out['name']} ({out['tenant']}): {', '.join(chosen)}, replicas {setup['min_replicas']}-"
    lines = [f"{head}{setup['max_replicas']}; targets TTFT {seconds(ttft)}, TPOT {seconds(tpot)}"]
    if w is None:
        lines.append("requests: not measured (this server runs no gateway)")
    else:
        attainment = "-" if w["slo_attainment_pct"] is None else f"{w['slo_attainment_pct']:.1f}%"
        lines.append(
            f"last {minutes(w['window_s'])}: {w['rate_per_s']:.2f} req/s, {w['requests']} answered, {w['errors']} "
            f"errors, SLO met {attainment}"
        )
        ttfts = "  ".join(f"{q} {_against(w[f'ttft_{q}_s'], ttft)}" for q in ("p50", "p90", "p99"))
        tpots = "  ".join(f"{q} {_against(w[f'tpot_{q}_s'], tpot)}" for q in ("p50", "p99"))
        lines.append(f"TTFT {ttfts}   TPOT {tpots}")
    if out["replicas"]:
        now, changes = out["replicas"][-1], len(out["replicas"])
        lines.append(
            f"replicas: {now['ready']} ready, {now['running']} running, {now['pending']} pending, {now['desired']} "
            f"desired ({changes} change{'' if changes == 1 else 's'} in the last {minutes(out['replicas_window_s'])})"
        )
    return lines


def _against(value: float | None, target: float) -> str:
    return seconds(value) + ("!" if value is not None and value > target else "")
