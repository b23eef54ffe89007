"""Job runtimes from the Microsoft Philly cluster: the empirical distribution, or a lognormal fitted on it.

The ``training`` workload (``tessera.sim.workloads.training``) calls ``philly_runtime_sampler(path)`` with
``../shared/traces/philly/philly_runtime.csv`` (CC BY 4.0; one column ``runtime``, seconds; read by path, never
copied), or with None for the embedded fit. Either way runtimes are clipped to [``MIN_RUNTIME_S``,
``MAX_RUNTIME_S``] = [60 s, 7 days] so that a simulation is not dominated by a handful of month-long jobs (on the
file 9.2% of runs are shorter than 60 s and 0.36% longer than 7 days; clipping moves neither the median nor p90).

The embedded fit: lognormal with median ``PHILLY_MEDIAN_S`` = 1,186 s and log-space sigma ``PHILLY_LOG_SIGMA`` =
1.86, fitted once on the 83,154 Philly runtimes by matching their median (1,186 s) and 90th percentile (12,859 s):
sigma = ln(12,859 / 1,186) / z(0.9). (A maximum-likelihood fit on the log runtimes gives median 940 s and sigma
2.18, which misplaces both quantiles.) The fit has a lighter tail than the data (p99 90,000 s against 287,283 s):
the clipped mean is about 6,500 s against the file's 12,486 s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from tessera.core.errors import InputFileError, InvalidRequestError
from tessera.sim.traces.tables import read_table

FloatArray = npt.NDArray[np.float64]

PHILLY_RUNTIME_FILE = "philly_runtime.csv"
# Fitted on ../shared/traces/philly/philly_runtime.csv (median and p90 matched; see the module docstring).
PHILLY_MEDIAN_S = 1186.0
PHILLY_LOG_SIGMA = 1.86
MIN_RUNTIME_S = 60.0
MAX_RUNTIME_S = 7 * 24 * 3600.0


@dataclass(frozen=True, eq=False)
class RuntimeSampler:
    """Job runtimes in seconds: bootstrap draws from observed runtimes, or a clipped lognormal."""

    source: str  # what the runtimes come from: a file path or "lognormal fit"
    empirical_s: FloatArray | None = None  # observed runtimes (already clipped); None: use the lognormal
    median_s: float = PHILLY_MEDIAN_S  # lognormal median (when empirical_s is None); > 0
    log_sigma: float = PHILLY_LOG_SIGMA  # lognormal sigma of log runtime; >= 0
    min_s: float = MIN_RUNTIME_S  # every draw is clipped to [min_s, max_s]
    max_s: float = MAX_RUNTIME_S
    seed: int = 0  # the RNG seed ``sample`` uses

    def __post_init__(self) -> None:
        if not (math.isfinite(self.median_s) and self.median_s > 0):
            raise InvalidRequestError("median_s", f"must be a finite number > 0, got {self.median_s}")
        if not (math.isfinite(self.log_sigma) and self.log_sigma >= 0):
            raise InvalidRequestError("log_sigma", f"must be a finite number >= 0, got {self.log_sigma}")
        if not 0 < self.min_s <= self.max_s:
            raise InvalidRequestError("min_s", f"need 0 < min_s <= max_s, got {self.min_s} and {self.max_s}")
        if self.empirical_s is not None and len(self.empirical_s) == 0:
            raise InvalidRequestError("empirical_s", "no runtimes to draw from")

    def draw(self, rng: np.random.Generator, count: int) -> FloatArray:
        """``count`` runtimes drawn with ``rng``."""
        if self.empirical_s is not None:
            values = rng.choice(self.empirical_s, size=count)
        else:
            values = rng.lognormal(math.log(self.median_s), self.log_sigma, size=count)
        return np.clip(np.asarray(values, dtype=np.float64), self.min_s, self.max_s)

    def sample(self, count: int) -> FloatArray:
        """``count`` runtimes from a fresh generator seeded with ``seed`` (the same values every call)."""
        return self.draw(np.random.default_rng(self.seed), count)


def philly_runtime_sampler(
    path: str | Path | None = None,
    seed: int = 0,
    *,
    min_s: float = MIN_RUNTIME_S,
    max_s: float = MAX_RUNTIME_S,
) -> RuntimeSampler:
    """The empirical Philly runtimes of ``path`` (clipped), or the embedded lognormal fit when ``path`` is None."""
    if path is None:
        return RuntimeSampler("lognormal fit", min_s=min_s, max_s=max_s, seed=seed)
    runtimes = load_runtimes(path)
    return RuntimeSampler(str(path), np.clip(runtimes, min_s, max_s), min_s=min_s, max_s=max_s, seed=seed)


def load_runtimes(path: str | Path) -> FloatArray:
    """The ``runtime`` column of a runtime list (seconds, >= 0); raises ``InputFileError`` for bad values."""
    name = str(path)
    columns, rows = read_table(path, ("runtime",), "runtimes")
    index = columns["runtime"]
    values = np.empty(len(rows), dtype=np.float64)
    for i, (line, row) in enumerate(rows):
        text = row[index].strip()
        try:
            value = float(text)
        except ValueError:
            raise InputFileError(name, line, "runtime", f"{text!r} is not a number") from None
        if not (math.isfinite(value) and value >= 0):
            raise InputFileError(name, line, "runtime", f"must be a finite number >= 0 (seconds), got {text}")
        values[i] = value
    return values
