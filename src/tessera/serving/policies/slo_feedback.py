"""The latency the autoscaler's SLO feedback sees: per model, a high percentile of its recent requests' TTFT and TPOT.

Both runtimes feed ``RecentLatency`` the same way, each served request once (``served``): the twin from its engine
model's completions, the live gateway from the answers it relays (a plain, non-streamed answer has no first token
to time, so only streamed answers count there). ``recent`` gives the autoscaler (``autoscaler.ModelSignals``) the
90th percentile of the model's last ``RECENT`` requests that finished within ``RECENT_S``, each relative to its own
class's target and expressed on the scale of one target (the interactive class's, by default), so that a batch
request's long TTFT does not look like an interactive miss.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping

from tessera.serving.policies.requests import DEFAULT_SLO_TARGETS, SloClass, SloTarget

RECENT = 50  # served requests the feedback looks at...
RECENT_S = 20.0  # ...if they finished this recently


class RecentLatency:
    """See the module docstring. ``scale``: the class whose targets ``recent`` speaks in."""

    __slots__ = ("_footprints", "_recent", "horizon_s", "scale", "size", "targets")

    def __init__(
        self,
        targets: Mapping[SloClass, SloTarget] = DEFAULT_SLO_TARGETS,
        scale: SloClass = SloClass.INTERACTIVE,
        size: int = RECENT,
        horizon_s: float = RECENT_S,
    ) -> None:
        self.targets = targets
        self.scale = scale
        self.size = size
        self.horizon_s = horizon_s
        self._recent: dict[str, deque[tuple[float, float, float]]] = {}  # model -> (finish, TTFT, TPOT / targets)
        self._footprints: dict[str, float] = {}  # model -> its mean KV footprint (``updated_footprint``)

    def arrived(self, model: str, prompt_tokens: int, predicted_output_tokens: int) -> None:
        """One request of ``model`` arrived: its mean footprint learns it (the live gateway's; the twin keeps its
        own per model runtime)."""
        mean = self._footprints.get(model)
        self._footprints[model] = updated_footprint(mean, prompt_tokens, predicted_output_tokens)

    def footprint(self, model: str) -> float | None:
        return self._footprints.get(model)

    def served(self, model: str, finish_s: float, slo: SloClass, ttft_s: float, tpot_s: float | None) -> None:
        """One request of ``model`` served: its TTFT and TPOT (None: one token, or not known)."""
        recent = self._recent.get(model)
        if recent is None:
            recent = self._recent[model] = deque(maxlen=self.size)
        target = self.targets[slo]
        tpot = math.nan if tpot_s is None else tpot_s / target.tpot_s
        recent.append((finish_s, ttft_s / target.ttft_s, tpot))

    def recent(self, model: str, now_s: float) -> tuple[float | None, float | None]:
        """The 90th percentiles (nearest rank) of TTFT and TPOT (see the module docstring); None without data."""
        recent = self._recent.get(model)
        if not recent:
            return None, None
        since = now_s - self.horizon_s
        ttft = sorted(t for finish, t, _ in recent if finish >= since)
        if not ttft:
            return None, None
        tpot = sorted(p for finish, _, p in recent if finish >= since and p == p)  # p == p: not NaN
        scale = self.targets[self.scale]
        return _p90(ttft) * scale.ttft_s, (_p90(tpot) * scale.tpot_s if tpot else None)

    def forget(self, model: str) -> None:
        """``model`` is gone: a model deployed later under its name starts afresh."""
        self._recent.pop(model, None)
        self._footprints.pop(model, None)


def _p90(ordered: list[float]) -> float:
    return ordered[min((len(ordered) * 9) // 10, len(ordered) - 1)]


FOOTPRINT_ALPHA = 0.01  # the weight of one arrival in a model's mean footprint


def updated_footprint(mean: float | None, prompt_tokens: int, predicted_output_tokens: int) -> float:
    """A model's mean KV footprint per sequence (prompt + half a predicted answer), averaged over about its last
    hundred arrivals, after one more arrival: what the autoscaler's per-replica target divides a replica's KV cache
    by (``sizing.concurrency_target``), in the twin and live alike."""
    footprint = prompt_tokens + predicted_output_tokens / 2
    return footprint if mean is None else mean + FOOTPRINT_ALPHA * (footprint - mean)
