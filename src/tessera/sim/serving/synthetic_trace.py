"""A seeded, Azure-like LLM request trace, so that ``tessera simulate serving`` runs without a trace file.

Called by the study when ``--trace`` is omitted, and by tests. Its parameters are round figures chosen to give the
same kind of workload as the public Azure LLM conversation trace (bursty arrivals at about 5.5 requests per second,
long-tailed prompt and output lengths); they are not fitted to, nor copied from, any data:

- arrivals: a doubly stochastic Poisson process. Time is cut into ``BURST_WINDOW_S`` windows; each window's rate is
  ``rate_per_s`` times a lognormal factor (log-sd ``BURST_LOG_SD``, normalised to mean 1 over the trace), and its
  arrivals are that many Poisson arrivals placed uniformly in the window;
- prompt tokens: lognormal with median ``PROMPT_MEDIAN`` and log-sd ``PROMPT_LOG_SD``, rounded, clipped to
  ``[1, PROMPT_MAX]``;
- output tokens: lognormal with median ``OUTPUT_MEDIAN`` and log-sd ``OUTPUT_LOG_SD``, rounded, clipped to
  ``[1, OUTPUT_MAX]``, independent of the prompt.
"""

from __future__ import annotations

import math

import numpy as np

from tessera.core.errors import InvalidRequestError
from tessera.sim.serving.trace import TraceArrays, make_trace

SYNTHETIC_TRACE_NAME = "synthetic-azure-like"
DEFAULT_RATE_PER_S = 5.5
DEFAULT_DURATION_S = 3600.0
BURST_WINDOW_S = 30.0
BURST_LOG_SD = 0.35
PROMPT_MEDIAN = 1000.0
PROMPT_LOG_SD = 1.0
PROMPT_MAX = 8192
OUTPUT_MEDIAN = 128.0
OUTPUT_LOG_SD = 0.9
OUTPUT_MAX = 2048


def synthetic_llm_trace(
    seed: int = 0, duration_s: float = DEFAULT_DURATION_S, rate_per_s: float = DEFAULT_RATE_PER_S
) -> TraceArrays:
    """A bursty trace of about ``rate_per_s * duration_s`` requests (see the module's parameters)."""
    if not duration_s > 0 or not math.isfinite(duration_s):
        raise InvalidRequestError("duration_s", f"must be a finite number > 0, got {duration_s}")
    if not rate_per_s > 0 or not math.isfinite(rate_per_s):
        raise InvalidRequestError("rate_per_s", f"must be a finite number > 0, got {rate_per_s}")
    rng = np.random.default_rng(seed)
    windows = max(1, math.ceil(duration_s / BURST_WINDOW_S))
    edges = np.minimum(np.arange(windows + 1) * BURST_WINDOW_S, duration_s)
    factors = rng.lognormal(0.0, BURST_LOG_SD, size=windows)
    factors /= factors.mean()
    counts = rng.poisson(rate_per_s * factors * np.diff(edges))
    if counts.sum() == 0:
        counts[0] = 1  # a trace has at least one request
    starts = np.repeat(edges[:-1], counts)
    widths = np.repeat(np.diff(edges), counts)
    arrivals = starts + rng.random(starts.size) * widths
    n = arrivals.size
    prompt = _lognormal_tokens(rng, PROMPT_MEDIAN, PROMPT_LOG_SD, PROMPT_MAX, n)
    output = _lognormal_tokens(rng, OUTPUT_MEDIAN, OUTPUT_LOG_SD, OUTPUT_MAX, n)
    return make_trace(SYNTHETIC_TRACE_NAME, arrivals, prompt, output, "synthetic")


def _lognormal_tokens(
    rng: np.random.Generator, median: float, log_sd: float, maximum: int, size: int
) -> np.ndarray[tuple[int], np.dtype[np.int64]]:
    values = np.rint(rng.lognormal(math.log(median), log_sd, size=size))
    return np.clip(values, 1, maximum).astype(np.int64)
