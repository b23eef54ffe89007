"""What ``tessera models stats NAME`` prints (``cli.model_stats.stats_lines``) from the API's answer."""

from __future__ import annotations

from typing import Any

from tessera.cli.model_stats import stats_lines


def answer() -> dict[str, Any]:
    figures = {
        "window_s": 300.0, "span_s": 300.0, "requests": 600, "rate_per_s": 2.0, "errors": 3, "slo_met": 588,
        "slo_attainment_pct": 98.0, "samples": 597, "ttft_p50_s": 0.12, "ttft_p90_s": 0.9, "ttft_p99_s": 2.5,
        "tpot_p50_s": 0.02, "tpot_p99_s": 0.05,
    }  # fmt: skip
    return {
        "name": "chat", "tenant": "team-a", "now": 1000.0, "targets": {"ttft_s": 2.0, "tpot_s": 0.2},
        "window": figures,
        "replicas": [{"at": 900.0, "ready": 1, "running": 2, "pending": 0, "desired": 2}], "replicas_window_s": 3600.0,
        "setup": {"serving_setup": "tessera", "router": "prefix-affinity", "autoscaler": None, "slo": "interactive",
                  "min_replicas": 1, "max_replicas": 3, "idle_timeout_s": 30.0, "replica_concurrency": 32},
    }  # fmt: skip


def test_the_lines_give_the_setup_the_window_against_the_targets_and_the_replicas() -> None:
    lines = stats_lines(answer())
    assert lines[0] == (
        "chat (team-a): setup tessera, router prefix-affinity, SLO interactive, replicas 1-3; targets TTFT 2.00 s,"
        " TPOT 200 ms"
    )
    assert lines[1] == "last 5 min: 2.00 req/s, 600 answered, 3 errors, SLO met 98.0%"
    assert lines[2] == "TTFT p50 120 ms  p90 900 ms  p99 2.50 s!   TPOT p50 20 ms  p99 50 ms"  # ! over the target
    assert lines[3] == "replicas: 1 ready, 2 running, 0 pending, 2 desired (1 change in the last 60 min)"


def test_a_server_without_a_gateway_says_its_requests_are_not_measured() -> None:
    out = answer()
    out["window"] = None
    assert stats_lines(out)[1] == "requests: not measured (this server runs no gateway)"
