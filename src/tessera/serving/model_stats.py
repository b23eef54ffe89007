"""Each served model's recent requests, for display (the dashboard's models view, ``GET /v1/models/NAME/stats``):
over the last ``window_s`` (5 min), its request rate, errors, SLO attainment and its TTFT and TPOT percentiles.
Prometheus keeps the long history (``gateway.metrics``); this window answers "how is it doing now" without one.

The gateway records each answered request (``ModelWindow.record``, called by ``GatewayMetrics.answered`` on the
gateway's event loop): a lock, a clock read, a few array writes. Percentiles are computed only when read
(``summary``, from the API's threads).

- **Counts** (answered, errors, SLO met) are exact: per model, a ring of ``bucket_s`` buckets; the window is the
  buckets from the one ``window_s`` ago to now (so it covers ``window_s`` and at most one ``bucket_s`` more). The rate
  divides by the time they cover (``span_s``): from the oldest one's start, or from the window's making when that is
  later (a server up for a minute).
- **Percentiles** are over the newest ``max_samples`` successful answers in the window (a ring per model): exact
  below ``max_samples / window_s`` requests per second, those of the newest requests above it.
- **Memory** is bounded: ``max_samples`` and the buckets per model (a few tens of KiB); at most ``max_models``
  models, the one answered longest ago forgotten for a new one.

**Meeting the SLO** (``meets_slo``, as the serving twin judges it in ``sim.serving.outcomes``): a successful answer
(HTTP 2xx or 3xx) whose TTFT is within its class's TTFT target and whose TPOT is within its TPOT target. An error
answer misses it (the twin's dropped request). A plain (not streamed) answer has no TPOT: its TTFT is the time to the
whole answer, and it is judged on that alone, against the TTFT target (stricter than a stream, whose tokens after
the first have the TPOT budget too; an answer sent in one chunk is judged the same way).
"""

from __future__ import annotations

import math
import threading
import time
from array import array
from collections.abc import Callable
from dataclasses import dataclass

from tessera.serving.policies.requests import SloTarget

WINDOW_S = 300.0


@dataclass(frozen=True, slots=True)
class WindowConfig:
    window_s: float = WINDOW_S  # how far back the figures look
    bucket_s: float = 5.0  # resolution of the counts (the window's start moves in these steps)
    max_samples: int = 1024  # per model: the newest successful answers kept for the percentiles
    max_models: int = 512  # models tracked at once

    @classmethod
    def over(cls, window_s: float) -> WindowConfig:
        """A window of ``window_s`` counted in 60 buckets."""
        return cls(window_s=window_s, bucket_s=window_s / 60)

    def __post_init__(self) -> None:
        if not (self.window_s > 0 and 0 < self.bucket_s <= self.window_s):
            raise ValueError(f"window_s {self.window_s} and bucket_s {self.bucket_s}: need 0 < bucket_s <= window_s")
        if self.max_samples < 1 or self.max_models < 1:
            raise ValueError("max_samples and max_models must be at least 1")


@dataclass(frozen=True, slots=True)
class WindowSummary:
    """One model's figures over the window (None: no successful answer to measure)."""

    window_s: float  # the window asked for
    span_s: float  # the time the counts cover: window_s, up to one bucket_s more; less on a younger server
    answered: int  # requests answered (any status)
    errors: int  # of those, answered with an error status (not 2xx or 3xx)
    slo_met: int  # of those, that met their class's TTFT and TPOT targets (``meets_slo``)
    samples: int  # successful answers the percentiles are over (at most ``max_samples``)
    ttft_p50_s: float | None
    ttft_p90_s: float | None
    ttft_p99_s: float | None
    tpot_p50_s: float | None  # over streamed answers of two chunks or more
    tpot_p99_s: float | None

    @property
    def rate_per_s(self) -> float:
        return self.answered / self.span_s if self.span_s > 0 else 0.0

    @property
    def slo_attainment_pct(self) -> float | None:
        return 100.0 * self.slo_met / self.answered if self.answered else None


def succeeded(code: int) -> bool:
    return 200 <= code < 400


def meets_slo(target: SloTarget | None, code: int, ttft_s: float | None, tpot_s: float | None) -> bool:
    """Whether an answer met its class's targets (the module docstring); ``tpot_s`` None: a plain answer."""
    if target is None or ttft_s is None or not succeeded(code):
        return False
    return ttft_s <= target.ttft_s and (tpot_s is None or tpot_s <= target.tpot_s)


def percentile(ordered: list[float], q: float) -> float | None:
    """The nearest-rank ``q`` quantile (0 < q <= 1) of sorted values; None for none."""
    if not ordered:
        return None
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


class _Series:
    """One model's buckets and samples: rings indexed by bucket number and by sample count."""

    __slots__ = ("bucket_ids", "counts", "times", "ttft", "tpot", "written", "last_s")

    def __init__(self, buckets: int, samples: int) -> None:
        self.bucket_ids = array("q", [-1]) * buckets
        self.counts = array("q", [0]) * (3 * buckets)  # per bucket: answered, errors, met
        self.times = array("d", [-math.inf]) * samples
        self.ttft = array("d", [0.0]) * samples
        self.tpot = array("d", [math.nan]) * samples  # NaN: no TPOT (a plain answer)
        self.written = 0  # samples written so far (the ring's next slot is this modulo its size)
        self.last_s = -math.inf


class ModelWindow:
    """See the module docstring. ``clock``: seconds, monotonic (read at each record and summary)."""

    def __init__(self, config: WindowConfig | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config or WindowConfig()
        self.clock = clock
        self.started_s = clock()
        self._buckets = math.ceil(self.config.window_s / self.config.bucket_s) + 1
        self._series: dict[str, _Series] = {}
        self._lock = threading.Lock()

    def record(self, model: str, code: int, met: bool, ttft_s: float | None, tpot_s: float | None) -> None:
        """One answered request of ``model``: its status, whether it met its SLO, its TTFT and TPOT (None: not
        measured). The gateway's hot path."""
        bucket_s, now = self.config.bucket_s, self.clock()
        bucket = int(now // bucket_s)
        slot = bucket % self._buckets
        with self._lock:
            series = self._series.get(model)
            if series is None:
                series = self._add(model)
            series.last_s = now
            counts = series.counts
            if series.bucket_ids[slot] != bucket:
                series.bucket_ids[slot] = bucket
                counts[3 * slot] = counts[3 * slot + 1] = counts[3 * slot + 2] = 0
            counts[3 * slot] += 1
            if not succeeded(code):
                counts[3 * slot + 1] += 1
            elif ttft_s is not None:
                i = series.written % len(series.times)
                series.times[i], series.ttft[i] = now, ttft_s
                series.tpot[i] = math.nan if tpot_s is None else tpot_s
                series.written += 1
            if met:
                counts[3 * slot + 2] += 1

    def _add(self, model: str) -> _Series:
        if len(self._series) >= self.config.max_models:
            stalest = min(self._series, key=lambda name: self._series[name].last_s)
            del self._series[stalest]
        series = self._series[model] = _Series(self._buckets, self.config.max_samples)
        return series

    def summary(self, model: str) -> WindowSummary:
        """``model``'s figures over the window, now (all zero and None for a model with no answer in it)."""
        config, now = self.config, self.clock()
        first_bucket = math.floor((now - config.window_s) / config.bucket_s)
        span_s = max(now - max(first_bucket * config.bucket_s, self.started_s), 1e-9)
        with self._lock:
            series = self._series.get(model)
            if series is None:
                return _empty(config.window_s, span_s)
            totals = [0, 0, 0]
            for slot, bucket in enumerate(series.bucket_ids):
                if bucket >= first_bucket:
                    for k in range(3):
                        totals[k] += series.counts[3 * slot + k]
            since = first_bucket * config.bucket_s  # the counts' window, to the bucket
            kept = [i for i in range(min(series.written, len(series.times))) if series.times[i] >= since]
            ttft = sorted(series.ttft[i] for i in kept)
            tpot = sorted(t for i in kept if not math.isnan(t := series.tpot[i]))
        return WindowSummary(
            window_s=config.window_s, span_s=span_s, answered=totals[0], errors=totals[1], slo_met=totals[2],
            samples=len(ttft), ttft_p50_s=percentile(ttft, 0.5), ttft_p90_s=percentile(ttft, 0.9),
            ttft_p99_s=percentile(ttft, 0.99), tpot_p50_s=percentile(tpot, 0.5), tpot_p99_s=percentile(tpot, 0.99),
        )  # fmt: skip


def _empty(window_s: float, span_s: float) -> WindowSummary:
    return WindowSummary(window_s, span_s, 0, 0, 0, 0, None, None, None, None, None)
