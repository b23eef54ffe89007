"""How far a running job of the timeline replay has got, and when it ends at its current speed.

Every running job has a ``Progress``: the seconds it still needs with its whole gang at full (isolated) speed on the
GPU model it runs on, measured at ``since_s``, and the speed it has run at since: ``workers / gang`` (elastic jobs,
linear scaling) times ``factor`` (co-location: the share of its isolated throughput it gets beside the jobs sharing
its GPU, ``sim/replay/colocation.py``). A resize or a change of GPU partners folds the progress so far in and starts
a new segment (``changed``); the replay then reschedules the job's departure.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Progress:
    """``left_full_s`` seconds still to run with the whole gang at full speed at ``since_s``, running since then
    on ``workers`` of ``gang`` workers at ``factor`` of the isolated speed."""

    left_full_s: float
    since_s: float
    workers: int
    gang: int
    factor: float = 1.0

    @property
    def speed(self) -> float:
        """Fraction of the whole gang's isolated speed."""
        return self.workers / self.gang * self.factor

    def left_at(self, now_s: float) -> float:
        """Whole-gang, full-speed seconds still to run at ``now_s``."""
        return max(self.left_full_s - (now_s - self.since_s) * self.speed, 0.0)

    @property
    def end_s(self) -> float:
        """When it ends if nothing changes its speed (infinity while it makes no progress)."""
        if self.speed <= 0:
            return math.inf
        return self.since_s + self.left_full_s / self.speed

    def changed(self, now_s: float, *, workers: int | None = None, factor: float | None = None) -> Progress:
        """From ``now_s`` on, with ``workers`` and/or ``factor`` changed."""
        return dataclasses.replace(
            self,
            left_full_s=self.left_at(now_s),
            since_s=now_s,
            workers=self.workers if workers is None else workers,
            factor=self.factor if factor is None else factor,
        )
