"""``SplitwiseCompatPerf``: the Splitwise simulator's timing rules, for the fidelity benchmark against its results
(``../shared/traces/splitwise-results/README.md`` describes them).

- Two tables against "batch tokens" = prompt_size x batch_size of the grid rows of one (model, hardware, TP): the
  median prompt time and the median token time over all rows with that value, interpolated linearly and
  extrapolated linearly outside on the end segments (no monotone repair: the tables are used as that simulator
  uses them; values are floored at zero, which it asserts never happens).
- Prefill-only iteration: prefill(sum of its prompt tokens).
- Decode-only iteration of B sequences: the token table at x = B (so about its batch-1 value whatever B is, and
  blind to context length).
- Mixed iteration: 1.1 x prefill(prompt tokens + decoding sequences).

``decode_affine(B)`` is ``(token_table(B), 0.0)``: the step does not depend on the KV tokens.
"""

from __future__ import annotations

import bisect
import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tessera.serving.perf_csv import SplitwiseRow, read_splitwise_rows, select_config

MIXED_FACTOR = 1.1


@dataclass(frozen=True, slots=True)
class LinearTable:
    """Linear interpolation through the knots, extrapolated on the end segments (one knot: a constant)."""

    xs: tuple[float, ...]
    ys: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.xs or len(self.xs) != len(self.ys):
            raise ValueError("a table needs at least one knot and as many ys as xs")
        if any(b <= a for a, b in zip(self.xs, self.xs[1:], strict=False)):
            raise ValueError(f"table xs must be strictly increasing, got {self.xs}")

    def __call__(self, x: float) -> float:
        xs, ys = self.xs, self.ys
        if len(xs) == 1:
            return max(ys[0], 0.0)
        i = min(max(bisect.bisect_right(xs, x) - 1, 0), len(xs) - 2)
        x0, x1, y0, y1 = xs[i], xs[i + 1], ys[i], ys[i + 1]
        return max(y0 + (y1 - y0) * (x - x0) / (x1 - x0), 0.0)

    @classmethod
    def of_medians(cls, samples: Sequence[tuple[int, float]]) -> LinearTable:
        by_x: dict[int, list[float]] = defaultdict(list)
        for x, y in samples:
            by_x[x].append(y)
        xs = sorted(by_x)
        return cls(tuple(float(x) for x in xs), tuple(statistics.median(by_x[x]) for x in xs))


@dataclass(frozen=True, slots=True)
class SplitwiseCompatPerf:
    prefill: LinearTable  # seconds against batch tokens
    decode: LinearTable  # seconds against batch tokens (looked up at the batch size)

    @classmethod
    def from_csv(
        cls, path: str | Path, model: str = "llama2-70b", hardware: str = "h100-80gb", tensor_parallel: int = 8
    ) -> SplitwiseCompatPerf:
        return cls.from_rows(select_config(path, read_splitwise_rows(path), model, hardware, tensor_parallel))

    @classmethod
    def from_rows(cls, rows: Sequence[SplitwiseRow]) -> SplitwiseCompatPerf:
        """From the raw rows of one configuration (every repeat counts in the medians, as in that simulator)."""
        if not rows:
            raise ValueError("SplitwiseCompatPerf needs at least one row")
        prefill = LinearTable.of_medians([(r.batch_tokens, r.prompt_time_ms / 1000) for r in rows])
        decode = LinearTable.of_medians([(r.batch_tokens, r.token_time_ms / 1000) for r in rows])
        return cls(prefill, decode)

    def iteration_s(self, prefill_tokens: int, decode_batch: int, kv_tokens: int) -> float:
        if prefill_tokens < 0 or decode_batch < 0 or kv_tokens < 0:
            raise ValueError(f"negative iteration size: ({prefill_tokens}, {decode_batch}, {kv_tokens})")
        if prefill_tokens == 0:
            return self.decode(decode_batch) if decode_batch else 0.0
        if decode_batch == 0:
            return self.prefill(prefill_tokens)
        return MIXED_FACTOR * self.prefill(prefill_tokens + decode_batch)

    def decode_affine(self, decode_batch: int) -> tuple[float, float]:
        if decode_batch < 0:
            raise ValueError(f"negative decode batch: {decode_batch}")
        return (self.decode(decode_batch) if decode_batch else 0.0, 0.0)
