"""The per-model window of recent requests (``serving.model_stats``): exact counts over the window, percentiles on
read, the SLO judged as the twin judges it, bounded memory; and the gateway's metrics feeding it."""

from __future__ import annotations

import math

import pytest

from tessera.serving.gateway.metrics import GatewayMetrics
from tessera.serving.model_stats import ModelWindow, WindowConfig, meets_slo, percentile
from tessera.serving.policies.requests import DEFAULT_SLO_TARGETS, SloClass, SloTarget

TARGET = SloTarget(ttft_s=2.0, tpot_s=0.2)


class Clock:
    def __init__(self, now_s: float = 1000.0) -> None:
        self.now_s = now_s

    def __call__(self) -> float:
        return self.now_s


def window(clock: Clock, **config: float) -> ModelWindow:
    return ModelWindow(WindowConfig(**config), clock)  # type: ignore[arg-type]


def test_an_answer_meets_its_slo_within_both_targets_and_a_plain_one_on_its_ttft_alone() -> None:
    assert meets_slo(TARGET, 200, 1.9, 0.19)
    assert not meets_slo(TARGET, 200, 2.1, 0.1)  # late first token
    assert not meets_slo(TARGET, 200, 0.5, 0.25)  # slow tokens after it
    assert meets_slo(TARGET, 200, 1.5, None)  # a plain answer: the whole answer within the TTFT target
    assert not meets_slo(TARGET, 200, 2.5, None)
    assert not meets_slo(TARGET, 502, 0.1, None)  # an error misses it, however fast
    assert not meets_slo(TARGET, 200, None, None)  # nothing came back
    assert not meets_slo(None, 200, 0.1, 0.01)  # an unknown class


def test_percentiles_are_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 0.5) == 50.0 and percentile(values, 0.99) == 99.0 and percentile(values, 1.0) == 100.0
    assert percentile([3.0], 0.5) == 3.0 and percentile([], 0.5) is None


def test_the_window_counts_rate_errors_and_attainment_and_reads_percentiles() -> None:
    clock = Clock()
    w = window(clock, window_s=60, bucket_s=1)
    clock.now_s += 120  # an old server: the span is the whole window
    for i in range(100):
        w.record("chat", 200, met=i < 90, ttft_s=0.01 * (i + 1), tpot_s=0.001 * (i + 1))
    w.record("chat", 502, met=False, ttft_s=None, tpot_s=None)
    w.record("chat", 200, met=True, ttft_s=0.5, tpot_s=None)  # plain: in the TTFT percentiles, not in TPOT's
    w.record("other", 200, met=True, ttft_s=9.0, tpot_s=None)
    s = w.summary("chat")
    assert (s.answered, s.errors, s.slo_met, s.samples) == (102, 1, 91, 101)
    assert s.span_s == pytest.approx(60.0)
    assert s.rate_per_s == pytest.approx(102 / 60)
    assert s.slo_attainment_pct == pytest.approx(100 * 91 / 102)
    assert s.ttft_p50_s == pytest.approx(0.5) and s.ttft_p99_s == pytest.approx(0.99)  # 100th of 101
    assert s.tpot_p50_s == pytest.approx(0.05) and s.tpot_p99_s == pytest.approx(0.099)
    assert w.summary("other").ttft_p50_s == 9.0  # models are kept apart


def test_requests_leave_the_window_as_it_moves_on() -> None:
    clock = Clock()
    w = window(clock, window_s=60, bucket_s=5)
    clock.now_s += 600
    w.record("chat", 200, met=True, ttft_s=5.0, tpot_s=None)
    clock.now_s += 30
    w.record("chat", 200, met=True, ttft_s=1.0, tpot_s=None)
    assert w.summary("chat").answered == 2
    clock.now_s += 40  # the first is 70 s old, the second 40 s
    s = w.summary("chat")
    assert (s.answered, s.samples, s.ttft_p99_s) == (1, 1, 1.0)
    clock.now_s += 3600  # far later: every bucket's slot was written long ago, and none counts
    s = w.summary("chat")
    assert (s.answered, s.samples, s.ttft_p50_s, s.slo_attainment_pct) == (0, 0, None, None)


def test_a_young_window_rates_over_its_age_and_an_unknown_model_has_no_figures() -> None:
    clock = Clock()
    w = window(clock, window_s=300, bucket_s=5)
    clock.now_s += 10
    for _ in range(20):
        w.record("chat", 200, met=True, ttft_s=0.1, tpot_s=0.01)
    s = w.summary("chat")
    assert s.span_s == pytest.approx(10.0) and s.rate_per_s == pytest.approx(2.0)
    empty = w.summary("nobody")
    assert (empty.answered, empty.rate_per_s, empty.ttft_p50_s, empty.slo_attainment_pct) == (0, 0.0, None, None)


def test_memory_is_bounded_per_model_and_in_models() -> None:
    clock = Clock()
    w = window(clock, window_s=60, bucket_s=1, max_samples=10, max_models=2)
    for i in range(25):
        w.record("chat", 200, met=True, ttft_s=float(i), tpot_s=None)
    s = w.summary("chat")
    assert s.answered == 25 and s.samples == 10  # counts stay exact; the percentiles are over the newest 10
    assert s.ttft_p50_s == 19.0 and s.ttft_p99_s == 24.0
    clock.now_s += 1
    w.record("b", 200, met=True, ttft_s=1.0, tpot_s=None)
    clock.now_s += 1
    w.record("c", 200, met=True, ttft_s=1.0, tpot_s=None)  # a third model: the one answered longest ago goes
    assert w.summary("chat").answered == 0 and w.summary("b").answered == 1 and w.summary("c").answered == 1


def test_a_window_config_is_checked() -> None:
    with pytest.raises(ValueError, match="bucket_s"):
        WindowConfig(window_s=10, bucket_s=20)
    with pytest.raises(ValueError, match="max_samples"):
        WindowConfig(max_samples=0)
    assert WindowConfig.over(600).bucket_s == 10


def test_the_gateway_metrics_feed_the_window_and_count_the_answers_that_met_their_slo() -> None:
    clock = Clock()
    w = window(clock, window_s=60, bucket_s=1)
    metrics = GatewayMetrics(window=w)
    interactive = DEFAULT_SLO_TARGETS[SloClass.INTERACTIVE]
    # A stream: first token at 0.5 s, then 10 chunks 0.05 s apart (TPOT 0.05 s): met.
    metrics.answered("chat", "interactive", 200, 10.0, 10.1, 10.5, 11.0, 11)
    # A plain answer after 3 s: over the interactive TTFT target.
    metrics.answered("chat", "interactive", 200, 20.0, 20.0, 23.0, 23.0, 1)
    metrics.answered("chat", "interactive", 502, 30.0, 30.0, None, 30.0, 0)
    s = w.summary("chat")
    assert (s.answered, s.errors, s.slo_met) == (3, 1, 1)
    assert s.ttft_p50_s == pytest.approx(0.5) and s.tpot_p99_s == pytest.approx(0.05)
    value = metrics.registry.get_sample_value
    labels = {"served_model": "chat", "slo": "interactive"}
    assert value("tessera_gateway_slo_met_total", labels) == 1.0
    assert value("tessera_gateway_slo_target_seconds", {"slo": "interactive", "signal": "ttft"}) == interactive.ttft_s
    assert value("tessera_gateway_slo_target_seconds", {"slo": "batch", "signal": "tpot"}) == 2.0
    assert math.isclose(value("tessera_gateway_time_per_output_token_seconds_sum", labels) or 0, 0.05)
