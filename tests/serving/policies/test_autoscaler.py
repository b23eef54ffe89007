"""Autoscaler step responses in virtual time, its presets, and bounds under random signals (Hypothesis)."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tessera.serving.policies.autoscaler import (
    AutoscalerConfig,
    AutoscalerState,
    ModelSignals,
    ScaleDecision,
    decide,
    knative_defaults,
    ray_serve_defaults,
    tessera_defaults,
)


class Fleet:
    """A model whose replicas start instantly: ready = the previous decision. Arrivals and idle time follow the
    in-flight count (an arrival whenever something is in flight)."""

    def __init__(self, config: AutoscalerConfig, ready: int = 1, now_s: float = 0.0) -> None:
        self.config, self.state, self.ready, self.now_s = config, AutoscalerState(), ready, now_s
        self.last_arrival_s = now_s
        self.decisions: list[ScaleDecision] = []

    def tick(
        self, in_flight: int, ttft_s: float | None = None, starting: int = 0, zero_ok: bool = False, queued: int = 0
    ) -> int:
        self.now_s += self.config.metrics_interval_s
        if in_flight:
            self.last_arrival_s = self.now_s
        signals = ModelSignals(
            "m", self.now_s, int(in_flight > 0), queued, in_flight, self.ready, starting,
            ttft_recent_s=ttft_s, idle_s=self.now_s - self.last_arrival_s, zero_ok=zero_ok,
        )  # fmt: skip
        decision, self.state = decide(signals, self.state, self.config)
        self.decisions.append(decision)
        self.ready = decision.desired
        return decision.desired

    def run(self, in_flight: int, seconds: float, **kwargs: object) -> list[int]:
        ticks = round(seconds / self.config.metrics_interval_s)
        return [self.tick(in_flight, **kwargs) for _ in range(ticks)]  # type: ignore[arg-type]


def _knative(target: float = 10.0, **changes: object) -> AutoscalerConfig:
    return dataclasses.replace(knative_defaults(), target_concurrency=target, target_utilization=1.0, **changes)  # type: ignore[arg-type]


def test_steady_load_gives_ceil_of_average_over_target() -> None:
    fleet = Fleet(_knative(), ready=3)
    assert fleet.run(25, 60)[-1] == 3
    assert fleet.decisions[-1].reason == "stable"


def test_a_burst_triggers_panic_and_no_scale_down_while_panicking() -> None:
    fleet = Fleet(_knative())
    fleet.run(10, 60)
    assert fleet.ready == 1
    up = fleet.tick(50)  # panic window (6 s): (50 x 2 + 10 x 4) / 6 = 23.3 -> 3 >= 2 x 1 ready
    assert up == 3 and fleet.decisions[-1].reason == "panic"
    more = fleet.run(50, 6)
    assert more[-1] == 5 and all(d.reason == "panic" for d in fleet.decisions[-3:])
    calm = fleet.run(1, 120)  # the panic lasts a stable window after the last trigger (at 62 s)
    reasons = [d.reason for d in fleet.decisions[-len(calm) :]]
    first_calm = reasons.index("stable")
    assert set(reasons[:first_calm]) == {"panic"} and set(calm[:first_calm]) == {5}
    assert fleet.now_s - 120 + (first_calm + 1) * 2.0 >= 62.0 + 60.0
    assert calm[-1] == 1


def test_scale_down_rate_halves_at_most_per_decision() -> None:
    fleet = Fleet(_knative(), ready=8)
    assert fleet.run(0, 2)[0] == 4  # Knative's max-scale-down-rate 2: floor(8 / 2)


def test_a_lull_scales_down_after_the_delay_then_to_zero_after_the_grace() -> None:
    config = dataclasses.replace(tessera_defaults(target_concurrency=10.0), target_utilization=1.0)
    fleet = Fleet(config, ready=3)
    fleet.run(30, 40)
    assert fleet.ready == 3
    lull = fleet.run(10, 80)  # the stable average falls over 20 s (wishes 3, 2, then 1), each step waits 30 s
    reasons = [d.reason for d in fleet.decisions[-len(lull) :]]
    assert lull == sorted(lull, reverse=True) and lull[-1] == 1
    first_wish_down = reasons.index("scale-down-delay")
    assert lull.index(2) - first_wish_down >= config.scale_down_delay_s / config.metrics_interval_s
    assert lull.index(1) - lull.index(2) >= 5  # the wishes of 2 age out of the trailing 30 s first
    idle = fleet.run(0, 60)  # without zero_ok, tessera keeps one
    assert idle[-1] == 1 and fleet.decisions[-1].reason == "idle-grace"
    idle = fleet.run(0, 2, zero_ok=True)
    assert idle == [0] and fleet.decisions[-1].reason == "scale-to-zero"


def test_knative_scales_to_zero_only_after_the_grace() -> None:
    fleet = Fleet(_knative())
    fleet.run(5, 20)
    idle = fleet.run(0, 40)
    first_zero = idle.index(0)
    assert all(r == 1 for r in idle[:first_zero])
    assert (first_zero + 1) * 2.0 >= 30.0  # idle since the last tick with traffic
    assert fleet.decisions[len(fleet.decisions) - len(idle) + first_zero].reason == "scale-to-zero"


@pytest.mark.parametrize("config", [knative_defaults(), ray_serve_defaults(), tessera_defaults()])
def test_scale_from_zero_on_one_held_request_at_once(config: AutoscalerConfig) -> None:
    fleet = Fleet(config, ready=0)
    fleet.run(0, config.metrics_interval_s * 3)
    assert fleet.ready == 0
    assert fleet.tick(1) == 1 and fleet.decisions[-1].reason == "scale-from-zero"
    # Starting already: no second replica for the same held request.
    fleet.ready = 0
    decision, _ = decide(ModelSignals("m", fleet.now_s + 10, 0, 0, 1, 0, 1), fleet.state, config)
    assert decision.desired == 1


def test_ray_upscale_waits_its_delay() -> None:
    fleet = Fleet(ray_serve_defaults())
    ups = fleet.run(8, 60)  # wants 4 replicas of 2 ongoing requests each
    assert ups[:2] == [1, 1] and fleet.decisions[0].reason == "upscale-delay"
    assert ups[-1] == 4 and ups.index(4) * 10.0 >= 30.0


def test_slo_feedback_adds_a_replica_once_per_start() -> None:
    config = tessera_defaults()
    fleet = Fleet(config, ready=2)
    fleet.run(20, 20)  # 20 / (24 x 0.8) -> 2 replicas
    assert fleet.ready == 2
    assert fleet.tick(20, ttft_s=1.7) == 2  # slow first tokens but nothing queued: more replicas would not help
    assert fleet.tick(20, ttft_s=1.7, queued=3) == 3 and fleet.decisions[-1].reason == "slo-feedback"  # > 0.5 x 2
    assert fleet.tick(20, ttft_s=1.7, starting=1, queued=3) == 3  # one is starting: no further step
    assert fleet.tick(20, ttft_s=0.9, queued=3) == 3  # within 50% of the target: no step, and no scale-down either
    assert fleet.decisions[-1].reason == "scale-down-delay"


def test_config_checks_and_time_order() -> None:
    with pytest.raises(ValueError, match="windows"):
        AutoscalerConfig(panic_window_s=90.0)
    with pytest.raises(ValueError, match="replica bounds"):
        AutoscalerConfig(min_replicas=5, max_replicas=2)
    state = AutoscalerState()
    decide(ModelSignals("m", 10.0, 0, 0, 0, 1, 0), state, knative_defaults())
    with pytest.raises(ValueError, match="back in time"):
        decide(ModelSignals("m", 9.0, 0, 0, 0, 1, 0), state, knative_defaults())


def test_presets_quote_their_public_defaults() -> None:
    knative, ray = knative_defaults(), ray_serve_defaults()
    assert (knative.target_concurrency, knative.stable_window_s, knative.panic_window_s) == (100.0, 60.0, 6.0)
    assert (knative.panic_threshold, knative.scale_to_zero_grace_s, knative.max_scale_up_rate) == (2.0, 30.0, 1000.0)
    assert (ray.target_concurrency, ray.upscale_delay_s, ray.scale_down_delay_s) == (2.0, 30.0, 600.0)
    assert (ray.metrics_interval_s, ray.stable_window_s, ray.min_replicas) == (10.0, 30.0, 0)
    assert math.isinf(ray.panic_threshold) and tessera_defaults().require_zero_ok


_signal = st.tuples(
    st.floats(0.0, 30.0),  # time step
    st.integers(0, 500),  # in flight
    st.integers(0, 3),  # starting
    st.one_of(st.none(), st.floats(0.0, 20.0)),  # ttft
    st.booleans(),  # zero ok
    st.floats(0.0, 120.0),  # idle
)


@given(
    preset=st.sampled_from([knative_defaults, ray_serve_defaults, tessera_defaults]),
    min_replicas=st.integers(0, 3),
    max_replicas=st.integers(3, 40),
    ready=st.integers(0, 10),
    steps=st.lists(_signal, min_size=1, max_size=60),
)
def test_desired_stays_within_bounds_and_never_drops_a_held_request(
    preset: object,
    min_replicas: int,
    max_replicas: int,
    ready: int,
    steps: list[tuple[float, int, int, float | None, bool, float]],
) -> None:
    config = dataclasses.replace(preset(), min_replicas=min_replicas, max_replicas=max_replicas)  # type: ignore[operator]
    state, now, previous = AutoscalerState(), 0.0, ready
    for dt, in_flight, starting, ttft, zero_ok, idle in steps:
        now += dt
        signals = ModelSignals("m", now, 0, 0, in_flight, ready, starting, ttft, None, idle, zero_ok)
        decision, state = decide(signals, state, config)
        assert min_replicas <= decision.desired <= max_replicas
        if in_flight > 0 and ready + starting == 0:
            assert decision.desired >= 1
        if decision.desired == 0:
            assert previous == 0 or (in_flight == 0 and idle >= config.scale_to_zero_grace_s)
        ready = previous = decision.desired
