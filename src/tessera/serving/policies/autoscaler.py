"""Autoscaler: desired replicas of one model from its recent concurrency, its latency and its previous state.

Knative-style (KPA) concurrency scaling, with the knobs of Ray Serve's autoscaler and an SLO feedback loop:

1. Each call records the model's in-flight requests (running + queued on replicas + held), a sample that stands
   for the time since the previous call. Averages are time-weighted over two trailing windows, stable and panic.
2. ``desired = ceil(average / (target_concurrency x target_utilization))`` over the stable window.
3. Panic: when the panic-window average asks for >= ``panic_threshold`` x the ready replicas, panic mode starts
   (and lasts a stable window after the last such reading): the panic average drives, and nothing scales down.
4. SLO feedback: when the recent TTFT (or TPOT) exceeds ``slo_fraction`` of its target, one ``slo_step`` more than
   the previous decision, at most once per replica start (not while another replica is starting), and never down.
5. Rate limits (Knative's): at most ``ceil(max_scale_up_rate x ready)``, at least ``floor(ready /
   max_scale_down_rate)``. Delays (Ray Serve's): a rise applies once wished for ``upscale_delay_s``, a fall once
   wished for ``scale_down_delay_s`` (then the highest wish over that delay, as Knative's scale-down delay).
6. Zero: from zero at once when a request is held (in flight and no replica ready or starting), bypassing delays;
   to zero when nothing is in flight, the last arrival is ``scale_to_zero_grace_s`` old, ``min_replicas`` is 0,
   no panic, and (with ``require_zero_ok``) the caller says the model can come back within its TTFT budget.
   Otherwise a model with traffic in the window keeps at least one replica.
7. Clamped to [min_replicas, max_replicas].

``decide`` expects calls at a steady tick (``metrics_interval_s``) in non-decreasing ``now_s``. The state is the
caller's; ``decide`` updates it in place and returns it.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

_EPS = 1e-9  # ceil(2.0000000001) must stay 2 after float division


@dataclass(frozen=True, slots=True)
class ModelSignals:
    model: str
    now_s: float
    arrivals: int  # since the previous call
    queued: int  # waiting in the replicas' engines
    in_flight: int  # running + queued on replicas + held (waiting for a replica)
    ready: int  # replicas serving
    starting: int  # replicas loading or starting
    ttft_recent_s: float | None = None  # a high percentile over a recent window; None without data
    tpot_recent_s: float | None = None
    idle_s: float = 0.0  # seconds since the last arrival
    zero_ok: bool = False  # the model could come back from zero within its TTFT budget (the caller judges)


@dataclass(frozen=True, slots=True)
class AutoscalerConfig:
    """Defaults: Knative's (see ``knative_defaults``); the presets below set every field explicitly."""

    target_concurrency: float = 100.0  # in-flight requests per replica at full utilisation
    target_utilization: float = 0.7  # the share of target_concurrency aimed at
    stable_window_s: float = 60.0
    panic_window_s: float = 6.0
    panic_threshold: float = 2.0  # x ready replicas; math.inf disables panic mode
    scale_to_zero_grace_s: float = 30.0
    require_zero_ok: bool = False  # scale to zero only when signals.zero_ok
    min_replicas: int = 0
    max_replicas: int = 1000
    max_scale_up_rate: float = 1000.0  # desired <= ceil(rate x max(ready, 1)); math.inf: no limit
    max_scale_down_rate: float = 2.0  # desired >= floor(ready / rate); math.inf: no limit
    upscale_delay_s: float = 0.0
    scale_down_delay_s: float = 0.0
    ttft_target_s: float | None = None  # SLO feedback on TTFT (None: off)
    tpot_target_s: float | None = None  # SLO feedback on TPOT (None: off)
    slo_fraction: float = 0.8  # feedback when the recent latency exceeds this share of its target
    slo_step: int = 1
    metrics_interval_s: float = 2.0  # the caller's tick; the first sample stands for one interval
    max_samples: int = 4096  # ring bound (a stable window of ticks fits with room to spare)

    def __post_init__(self) -> None:
        if self.target_concurrency <= 0 or not 0 < self.target_utilization <= 1:
            raise ValueError("target_concurrency must be > 0 and target_utilization in (0, 1]")
        if not 0 < self.panic_window_s <= self.stable_window_s:
            raise ValueError("windows must satisfy 0 < panic_window_s <= stable_window_s")
        if self.min_replicas < 0 or self.max_replicas < max(1, self.min_replicas):
            raise ValueError("replica bounds must satisfy 0 <= min_replicas <= max_replicas and max_replicas >= 1")
        if self.max_scale_up_rate <= 1 or self.max_scale_down_rate <= 1:
            raise ValueError("scale rates must be > 1")
        if min(self.scale_to_zero_grace_s, self.upscale_delay_s, self.scale_down_delay_s) < 0:
            raise ValueError("delays must be >= 0")
        if self.slo_step < 0 or self.metrics_interval_s <= 0 or self.max_samples < 2:
            raise ValueError("slo_step >= 0, metrics_interval_s > 0 and max_samples >= 2 are required")

    @property
    def per_replica(self) -> float:
        return self.target_concurrency * self.target_utilization


@dataclass(frozen=True, slots=True)
class ScaleDecision:
    desired: int
    reason: str  # "stable", "panic", "slo-feedback", "scale-from-zero", "scale-to-zero", "idle-grace",
    # "upscale-delay", "scale-down-delay"


@dataclass(slots=True)
class AutoscalerState:
    """The caller's per-model autoscaler memory."""

    samples: deque[tuple[float, float]] = field(default_factory=deque)  # (now_s, in_flight), oldest first
    desired: int = -1  # the previous decision; -1 before the first (then ready + starting stands for it)
    panic_until_s: float = -math.inf
    up_since_s: float | None = None  # when a rise was first wished for (upscale delay)
    down_since_s: float | None = None  # since when a fall has been wished for (scale-down delay)
    down_wishes: deque[tuple[float, int]] = field(default_factory=deque)  # (now_s, wish) over the trailing delay
    last_scale_down_s: float = -math.inf


def _record(state: AutoscalerState, now_s: float, in_flight: int, config: AutoscalerConfig) -> None:
    samples = state.samples
    if samples and now_s < samples[-1][0]:
        raise ValueError(f"decide: now_s went back in time ({now_s} < {samples[-1][0]})")
    samples.append((now_s, float(in_flight)))
    horizon = now_s - config.stable_window_s
    while len(samples) > config.max_samples or (len(samples) >= 2 and samples[1][0] <= horizon):
        samples.popleft()  # keep one sample older than the window: it bounds the oldest interval


def _window_average(state: AutoscalerState, now_s: float, window_s: float, interval_s: float) -> float:
    """Time-weighted average over (now - window, now]: each sample holds over the interval since the one before
    (the first over one metrics interval)."""
    start = now_s - window_s
    weighted = covered = 0.0
    samples = state.samples
    for i in range(len(samples) - 1, -1, -1):
        t, value = samples[i]
        if t <= start:
            break
        before = samples[i - 1][0] if i > 0 else t - interval_s
        dt = t - max(before, start)
        weighted += value * dt
        covered += dt
    if covered <= 0.0:
        return samples[-1][1]
    return weighted / covered


def _replicas_for(average: float, config: AutoscalerConfig) -> int:
    return max(0, math.ceil(average / config.per_replica - _EPS))


def _slo_violated(signals: ModelSignals, config: AutoscalerConfig) -> bool:
    """Recent latency over ``slo_fraction`` of its target. A slow TTFT counts only while requests are queued: with
    nothing waiting it is the engine's own time (prefill, a shared GPU), which another replica does not shorten,
    and the recent window still remembers a burst that is already absorbed."""
    f = config.slo_fraction
    ttft, tpot = signals.ttft_recent_s, signals.tpot_recent_s
    slow_first_token = config.ttft_target_s is not None and ttft is not None and ttft > f * config.ttft_target_s
    if slow_first_token and signals.queued > 0:
        return True
    return config.tpot_target_s is not None and tpot is not None and tpot > f * config.tpot_target_s


def _propose(signals: ModelSignals, state: AutoscalerState, config: AutoscalerConfig, previous: int) -> ScaleDecision:
    """The wish before delays and bounds: stable or panic average, then SLO feedback, then the rate limits."""
    now = signals.now_s
    stable = _window_average(state, now, config.stable_window_s, config.metrics_interval_s)
    panic = _window_average(state, now, config.panic_window_s, config.metrics_interval_s)
    want_stable, want_panic = _replicas_for(stable, config), _replicas_for(panic, config)
    observed = max(signals.ready, 1)
    if want_panic > 0 and want_panic >= config.panic_threshold * observed:
        state.panic_until_s = now + config.stable_window_s
    if now < state.panic_until_s:
        wish, reason = max(want_panic, want_stable, previous), "panic"
    else:
        wish, reason = want_stable, "stable"
    if _slo_violated(signals, config):
        step = config.slo_step if signals.starting == 0 else 0
        if previous + step > wish:
            wish, reason = previous + step, "slo-feedback"
    if config.max_scale_up_rate != math.inf:
        wish = min(wish, math.ceil(config.max_scale_up_rate * observed))
    if config.max_scale_down_rate != math.inf:
        wish = max(wish, math.floor(signals.ready / config.max_scale_down_rate))
    return ScaleDecision(wish, reason)


def _zero_allowed(signals: ModelSignals, state: AutoscalerState, config: AutoscalerConfig) -> bool:
    return (
        config.min_replicas == 0
        and signals.in_flight == 0
        and signals.idle_s >= config.scale_to_zero_grace_s
        and signals.now_s >= state.panic_until_s
        and (signals.zero_ok or not config.require_zero_ok)
    )


def _apply_delays(
    wish: ScaleDecision, previous: int, now: float, state: AutoscalerState, config: AutoscalerConfig
) -> ScaleDecision:
    """Ray Serve's upscale delay (a rise applies once wished for continuously over the delay, at its latest
    value) and Knative's scale-down delay (a fall applies once wished for over the delay, at the highest wish
    within the trailing delay, so that steps down follow the slowest part of the lull)."""
    if wish.desired >= previous:
        state.down_since_s = None
        state.down_wishes.clear()
        if wish.desired == previous:
            state.up_since_s = None
            return wish
        if state.up_since_s is None:
            state.up_since_s = now
        if now - state.up_since_s >= config.upscale_delay_s:
            state.up_since_s = None
            return wish
        return ScaleDecision(previous, "upscale-delay")
    state.up_since_s = None
    if state.down_since_s is None:
        state.down_since_s = now
    wishes, horizon = state.down_wishes, now - config.scale_down_delay_s
    wishes.append((now, wish.desired))
    while wishes[0][0] < horizon:
        wishes.popleft()
    if now - state.down_since_s >= config.scale_down_delay_s:
        highest = max(w for _, w in wishes)
        if highest < previous:
            return ScaleDecision(highest, wish.reason)
    return ScaleDecision(previous, "scale-down-delay")


def decide(
    signals: ModelSignals, state: AutoscalerState, config: AutoscalerConfig
) -> tuple[ScaleDecision, AutoscalerState]:
    """Desired replicas of ``signals.model`` now (see the module docstring for the rules, in order)."""
    _record(state, signals.now_s, signals.in_flight, config)
    previous = state.desired if state.desired >= 0 else signals.ready + signals.starting
    held_at_zero = signals.in_flight > 0 and signals.ready + signals.starting == 0
    wish = _propose(signals, state, config, previous)
    if held_at_zero or _zero_allowed(signals, state, config):
        state.up_since_s = state.down_since_s = None
        state.down_wishes.clear()
        if held_at_zero:
            decision = ScaleDecision(max(wish.desired, 1), "scale-from-zero")
        else:
            decision = ScaleDecision(0, "scale-to-zero")
    else:
        if wish.desired == 0 and previous > 0:
            wish = ScaleDecision(1, "idle-grace")  # traffic too recent (or zero not allowed): keep one
        decision = _apply_delays(wish, previous, signals.now_s, state, config)
    desired = min(config.max_replicas, max(config.min_replicas, decision.desired))
    if desired != decision.desired:
        decision = ScaleDecision(desired, decision.reason)
    if desired < previous:
        state.last_scale_down_s = signals.now_s
    state.desired = desired
    return decision, state


# ---------------------------------------------------------------------------------------------------- presets


def knative_defaults(max_replicas: int = 1000) -> AutoscalerConfig:
    """Knative Serving's KPA defaults (config-autoscaler, as documented for Knative Serving 1.x):
    ``container-concurrency-target-default`` 100 with ``container-concurrency-target-percentage`` 70 ("the
    autoscaler will try to maintain 7 concurrent connections per pod" for a limit of 10); ``stable-window`` 60 s;
    ``panic-window-percentage`` 10 (of the stable window: 6 s); ``panic-threshold-percentage`` 200; ``max-scale-up-
    rate`` 1000; ``max-scale-down-rate`` 2; ``scale-to-zero-grace-period`` 30 s; ``scale-down-delay`` 0 s;
    ``min-scale`` 0; ``max-scale`` 0 (unbounded; here ``max_replicas``); a 2 s tick. One difference, kept on
    purpose: Knative removes the last replica once the stable window saw no traffic; here once the last arrival
    is ``scale_to_zero_grace_s`` old and nothing is in flight (the issue's "scale-to-zero after 30 s idle")."""
    return AutoscalerConfig(
        target_concurrency=100.0,
        target_utilization=0.7,
        stable_window_s=60.0,
        panic_window_s=6.0,
        panic_threshold=2.0,
        scale_to_zero_grace_s=30.0,
        require_zero_ok=False,
        min_replicas=0,
        max_replicas=max_replicas,
        max_scale_up_rate=1000.0,
        max_scale_down_rate=2.0,
        upscale_delay_s=0.0,
        scale_down_delay_s=0.0,
        metrics_interval_s=2.0,
    )


def ray_serve_defaults(max_replicas: int = 1000) -> AutoscalerConfig:
    """Ray Serve's ``AutoscalingConfig`` defaults (Ray 2.x docs; ``target_ongoing_requests`` is 2 since Ray 2.32):
    ``target_ongoing_requests`` 2 (running + queued per replica); ``metrics_interval_s`` 10; ``look_back_period_s``
    30 (the averaging window); ``upscale_delay_s`` 30; ``downscale_delay_s`` 600; smoothing factors 1 and no
    up/down-scaling factor (no rate limit); no panic mode. ``min_replicas`` is 1 in Ray; here 0 with a 30 s idle
    grace, as the issue asks of its ``static-autoscale`` baseline (Ray's ``downscale_to_zero_delay_s`` would
    otherwise default to the 600 s downscale delay)."""
    return AutoscalerConfig(
        target_concurrency=2.0,
        target_utilization=1.0,
        stable_window_s=30.0,
        panic_window_s=30.0,
        panic_threshold=math.inf,
        scale_to_zero_grace_s=30.0,
        require_zero_ok=False,
        min_replicas=0,
        max_replicas=max_replicas,
        max_scale_up_rate=math.inf,
        max_scale_down_rate=math.inf,
        upscale_delay_s=30.0,
        scale_down_delay_s=600.0,
        metrics_interval_s=10.0,
    )


def tessera_defaults(
    ttft_target_s: float = 2.0,
    tpot_target_s: float = 0.2,
    target_concurrency: float = 24.0,
    max_replicas: int = 1000,
) -> AutoscalerConfig:
    """Sized for an LLM engine replica: ~24 sequences in flight per replica (a continuous batch that keeps decode
    steps short enough for a 200 ms TPOT on mid-size models), aimed at 80%; short windows (20 s stable, 4 s
    panic, panic at 1.5x) because a replica takes seconds to start from a warm cache; SLO feedback at 50% of the
    class's TTFT/TPOT targets (a warm start takes a second or two: at 80% the new replica comes too late); a 30 s
    scale-down delay against flapping; scale to zero after 30 s idle only when the caller says the model comes back
    within its TTFT budget (``signals.zero_ok``)."""
    return AutoscalerConfig(
        target_concurrency=target_concurrency,
        target_utilization=0.8,
        stable_window_s=20.0,
        panic_window_s=4.0,
        panic_threshold=1.5,
        scale_to_zero_grace_s=30.0,
        require_zero_ok=True,
        min_replicas=0,
        max_replicas=max_replicas,
        max_scale_up_rate=10.0,
        max_scale_down_rate=2.0,
        upscale_delay_s=0.0,
        scale_down_delay_s=30.0,
        ttft_target_s=ttft_target_s,
        tpot_target_s=tpot_target_s,
        slo_fraction=0.5,
        slo_step=1,
        metrics_interval_s=2.0,
    )
