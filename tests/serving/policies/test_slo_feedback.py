"""The SLO feedback's latency window, which the twin and the live gateway both feed."""

from __future__ import annotations

import pytest

from tessera.serving.policies.requests import DEFAULT_SLO_TARGETS, SloClass
from tessera.serving.policies.slo_feedback import RECENT, RECENT_S, RecentLatency

INTERACTIVE = DEFAULT_SLO_TARGETS[SloClass.INTERACTIVE]
BATCH = DEFAULT_SLO_TARGETS[SloClass.BATCH]


def test_the_90th_percentile_of_the_recent_requests_on_the_interactive_scale() -> None:
    window = RecentLatency()
    for i in range(10):  # TTFTs 0.1 .. 1.0 s, TPOTs 10 .. 100 ms
        window.served("m", 100.0, SloClass.INTERACTIVE, 0.1 * (i + 1), 0.01 * (i + 1))
    ttft, tpot = window.recent("m", 100.0)
    assert ttft == pytest.approx(1.0) and tpot == pytest.approx(0.1)  # nearest rank of 10: the 10th


def test_a_batch_request_counts_relative_to_its_own_target() -> None:
    """A batch request that took half its (long) TTFT target reads as half the interactive target, not a miss."""
    window = RecentLatency()
    window.served("m", 0.0, SloClass.BATCH, BATCH.ttft_s / 2, BATCH.tpot_s / 2)
    assert window.recent("m", 0.0) == pytest.approx((INTERACTIVE.ttft_s / 2, INTERACTIVE.tpot_s / 2))


def test_old_requests_and_other_models_do_not_count() -> None:
    window = RecentLatency()
    window.served("m", 0.0, SloClass.INTERACTIVE, 9.0, 0.9)
    window.served("other", 50.0, SloClass.INTERACTIVE, 1.0, 0.1)
    assert window.recent("m", RECENT_S + 0.1) == (None, None)
    assert window.recent("m", RECENT_S) == pytest.approx((9.0, 0.9))
    assert window.recent("never", 0.0) == (None, None)


def test_only_the_last_requests_count_and_unknown_tpot_is_left_out() -> None:
    window = RecentLatency()
    window.served("m", 0.0, SloClass.INTERACTIVE, 30.0, 3.0)  # pushed out by the RECENT after it
    for _ in range(RECENT):
        window.served("m", 1.0, SloClass.INTERACTIVE, 0.5, None)
    ttft, tpot = window.recent("m", 1.0)
    assert ttft == pytest.approx(0.5) and tpot is None
    window.forget("m")
    assert window.recent("m", 1.0) == (None, None)


def test_the_footprint_follows_arrivals_and_a_forgotten_model_starts_afresh() -> None:
    window = RecentLatency()
    window.arrived("m", 1_000, 256)
    assert window.footprint("m") == 1_128  # prompt + half a predicted answer
    window.arrived("m", 2_000, 256)
    assert 1_128 < (window.footprint("m") or 0) < 2_128  # averaged, not replaced
    window.served("m", 0.0, SloClass.INTERACTIVE, 1.0, 0.1)
    window.forget("m")  # undeployed: a model redeployed under its name inherits nothing
    assert window.footprint("m") is None and window.recent("m", 0.0) == (None, None)
