"""The fitting machinery of the performance model: a monotone piecewise-linear prefill curve and an affine-in-KV
decode step, fitted from measured (or user-profiled) iterations.

- ``PiecewiseLinear``: seconds against batch tokens, made non-decreasing by pooling adjacent violators (measured
  medians at small batches wobble by a few percent around the fixed cost of an iteration), linear on the end
  segments outside the knots, never below zero.
- ``DecodeStep``: one decode iteration of B sequences holding ``kv`` context tokens in all costs
  ``intercept + per_seq * B + per_seq_sq * B^2 + per_kv_token * kv`` up to the largest fitted batch, and continues
  on its tangent in B beyond it (a quadratic extrapolated far would grow without bound). Every coefficient is >= 0,
  so the step never shrinks as the batch or the contexts grow, and for a fixed B it is affine in kv (the engine
  fast-forwards runs of decode iterations in closed form).
- ``fit_decode_step``: non-negative least squares on relative errors (each measured point counts by its percentage
  error, as the fit is judged), with an optional physical floor on the per-KV-token cost.

Used by ``perf_calibrated`` (the Splitwise grid and user profiles) and ``perf_scaling``.
"""

from __future__ import annotations

import bisect
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import nnls


def pool_adjacent_violators(values: Sequence[float], weights: Sequence[float]) -> list[float]:
    """The non-decreasing sequence closest to ``values`` in weighted least squares (isotonic regression).

    Where a value is below its predecessor, the two (and any earlier values they then undercut) are replaced by
    their weighted mean; values already in order are returned unchanged."""
    if len(values) != len(weights):
        raise ValueError("values and weights must have the same length")
    blocks: list[tuple[float, float, int]] = []  # (mean, weight, count)
    for value, weight in zip(values, weights, strict=True):
        mean, total, count = float(value), float(weight), 1
        while blocks and blocks[-1][0] > mean:
            prev_mean, prev_weight, prev_count = blocks.pop()
            merged = prev_weight + total
            mean = (prev_mean * prev_weight + mean * total) / merged
            total, count = merged, prev_count + count
        blocks.append((mean, total, count))
    return [mean for mean, _, count in blocks for _ in range(count)]


@dataclass(frozen=True, slots=True)
class PiecewiseLinear:
    """A non-decreasing function of a non-negative x given by knots; see the module docstring for outside rules.

    One knot: the line through the origin and the knot (time proportional to tokens)."""

    xs: tuple[float, ...]
    ys: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.xs or len(self.xs) != len(self.ys):
            raise ValueError("a piecewise-linear curve needs at least one knot and as many ys as xs")
        if any(b <= a for a, b in zip(self.xs, self.xs[1:], strict=False)):
            raise ValueError(f"knot xs must be strictly increasing, got {self.xs}")
        if any(b < a for a, b in zip(self.ys, self.ys[1:], strict=False)) or self.ys[0] < 0:
            raise ValueError(f"knot ys must be >= 0 and non-decreasing, got {self.ys}")
        if self.xs[0] <= 0:
            raise ValueError(f"knot xs must be > 0, got {self.xs}")

    @classmethod
    def monotone(cls, xs: Sequence[float], ys: Sequence[float], weights: Sequence[float]) -> PiecewiseLinear:
        """The curve through (xs, ys) after pooling adjacent violators; xs strictly increasing."""
        pooled = pool_adjacent_violators([max(y, 0.0) for y in ys], weights)
        return cls(tuple(float(x) for x in xs), tuple(pooled))

    def __call__(self, x: float) -> float:
        xs, ys = self.xs, self.ys
        if len(xs) == 1:
            return ys[0] * x / xs[0]
        i = bisect.bisect_right(xs, x) - 1
        i = min(max(i, 0), len(xs) - 2)  # end segments extend outside the knots
        x0, x1, y0, y1 = xs[i], xs[i + 1], ys[i], ys[i + 1]
        return max(y0 + (y1 - y0) * (x - x0) / (x1 - x0), 0.0)


@dataclass(frozen=True, slots=True)
class DecodeStep:
    intercept_s: float
    per_seq_s: float
    per_seq_sq_s: float
    per_kv_token_s: float
    max_batch: int  # the largest batch the fit saw: beyond it, the batch terms continue on their tangent

    def __post_init__(self) -> None:
        for name in ("intercept_s", "per_seq_s", "per_seq_sq_s", "per_kv_token_s"):
            if not getattr(self, name) >= 0.0:
                raise ValueError(f"decode step: {name} must be >= 0, got {getattr(self, name)}")
        if self.max_batch < 1:
            raise ValueError(f"decode step: max_batch must be >= 1, got {self.max_batch}")

    def intercept_at(self, batch: int) -> float:
        """Seconds of a decode step of ``batch`` sequences before their KV reads (its value at kv = 0)."""
        edge = min(batch, self.max_batch)
        within = self.intercept_s + self.per_seq_s * edge + self.per_seq_sq_s * edge * edge
        if batch <= self.max_batch:
            return within
        tangent = self.per_seq_s + 2.0 * self.per_seq_sq_s * self.max_batch
        return within + tangent * (batch - self.max_batch)

    def seconds(self, batch: int, kv_tokens: float) -> float:
        return self.intercept_at(batch) + self.per_kv_token_s * kv_tokens


@dataclass(frozen=True, slots=True)
class DecodeSample:
    batch: int
    kv_tokens: float
    seconds: float


def fit_decode_step(samples: Sequence[DecodeSample], kv_floor_s: float = 0.0) -> DecodeStep:
    """Least squares of the relative error over ``samples``, every coefficient >= 0 and the per-KV-token cost
    >= ``kv_floor_s`` (the time the KV bytes take at the memory bandwidth, when the model's shape is known)."""
    if not samples:
        raise ValueError("fit_decode_step: no samples")
    if any(s.seconds <= 0 or s.batch < 1 or s.kv_tokens < 0 for s in samples):
        raise ValueError("fit_decode_step: samples need batch >= 1, kv_tokens >= 0 and seconds > 0")
    batch = np.array([s.batch for s in samples], dtype=float)
    kv = np.array([s.kv_tokens for s in samples], dtype=float)
    measured = np.array([s.seconds for s in samples], dtype=float)
    # Unknowns: intercept, per_seq, per_kv_token above the floor, per_seq_sq. Rows divided by the measurement, so
    # that the residuals are relative errors; the floor's share moves to the right-hand side.
    design = np.column_stack([np.ones_like(batch), batch, kv, batch * batch]) / measured[:, None]
    target = (measured - kv_floor_s * kv) / measured
    coef, _ = nnls(design, target)
    intercept, per_seq, kv_extra, per_seq_sq = (float(c) for c in coef)
    return DecodeStep(intercept, per_seq, per_seq_sq, kv_floor_s + kv_extra, int(batch.max()))


class IterationRule(ABC):
    """How one engine iteration's time follows from a prefill curve and a decode step (calibrated, scaled and
    roofline models share it).

    - Decode only (B sequences, kv context tokens): ``decode_intercept(B) + kv_token * kv``.
    - Prefill only (P prompt tokens): ``prefill(P)``, and never less than a decode step of one sequence: any
      iteration reads all the weights once.
    - Mixed: ``max(prefill(P + B) + kv_token * kv, decode(B, kv))``. One pass over the P + B tokens: the prefill
      curve already holds the weight read and the iteration's fixed cost, so adding a separate decode step would
      count them twice; what the decoding sequences add beyond their B tokens of compute is their attention over
      their contexts, ``kv_token * kv``. The max keeps a small prefill chunk in a large decode batch from costing
      less than the decode step alone (chunked prefill piggybacks on memory-bound decode).
    """

    __slots__ = ()

    @abstractmethod
    def prefill_s(self, tokens: int) -> float:
        """Seconds of a prefill-only pass over ``tokens`` batch tokens (before the one-sequence floor)."""

    @abstractmethod
    def decode_intercept_s(self, batch: int) -> float:
        """Seconds of a decode step of ``batch`` >= 1 sequences at zero context."""

    @abstractmethod
    def kv_token_s(self) -> float:
        """Seconds each context token of a decoding sequence adds to a step."""

    def iteration_s(self, prefill_tokens: int, decode_batch: int, kv_tokens: int) -> float:
        if prefill_tokens < 0 or decode_batch < 0 or kv_tokens < 0:
            raise ValueError(f"negative iteration size: ({prefill_tokens}, {decode_batch}, {kv_tokens})")
        kv_s = self.kv_token_s() * kv_tokens
        if prefill_tokens == 0:
            return self.decode_intercept_s(decode_batch) + kv_s if decode_batch else 0.0
        decode_s = self.decode_intercept_s(max(decode_batch, 1)) + kv_s
        return max(self.prefill_s(prefill_tokens + decode_batch) + kv_s, decode_s)

    def decode_affine(self, decode_batch: int) -> tuple[float, float]:
        if decode_batch < 0:
            raise ValueError(f"negative decode batch: {decode_batch}")
        if decode_batch == 0:
            return (0.0, 0.0)
        return (self.decode_intercept_s(decode_batch), self.kv_token_s())
