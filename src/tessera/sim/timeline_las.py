"""LAS service of the timeline simulator's jobs (``TimelinePolicy.las_thresholds_gpu_s``: tiresias, tessera).

A job's attained service is the GPUs it held times the seconds it ran, summed over its runs; its LAS level
(``core.queueing.las``) drops at each threshold. ``LasService`` keeps the service up to each running job's current
run start (or last resize) and gives a job's priority at any time: the LAS level itself (tiresias), or, with
``las_within_class`` (tessera), the job's priority class first and the LAS level among its preemptible jobs.
``recheck_delays`` says when a running job's level will drop, so that the replay steps again then. Used by
``tessera.sim.timeline`` and ``tessera.sim.timeline_elastic`` (a resize folds in the service at the old size).
"""

from __future__ import annotations

from tessera.core.queueing.las import demotion_delays_s, las_priority

LAS_CLASS_SPREAD = 10  # more than the number of LAS levels: a class never falls below the next one
LAS_EPSILON_GPU_S = 1e-6  # a recheck event lands exactly on a threshold: count it as reached despite rounding


class LasService:
    def __init__(self, thresholds_gpu_s: tuple[float, ...], within_class: bool, jobs: int) -> None:
        self.thresholds = thresholds_gpu_s
        self.within_class = within_class
        self.attained_gpu_s = [0.0] * jobs  # GPU-seconds received, up to the current run's start (or last resize)
        self.run_started: dict[int, float] = {}  # when each running job's current run started (or was resized)

    def priority(self, i: int, now: float, gpus: float, job_priority: int, preemptible: bool) -> int:
        """Job ``i``'s priority at ``now`` while it holds (or would hold) ``gpus`` GPUs."""
        attained = self.attained_gpu_s[i]
        started = self.run_started.get(i)
        if started is not None:
            attained += gpus * (now - started)
        las = las_priority(attained + LAS_EPSILON_GPU_S, self.thresholds)
        if not self.within_class:
            return las
        # Classes are far apart (e.g. 1000, 100, 0); LAS levels (0, -1, -2) order jobs within one class.
        return job_priority * LAS_CLASS_SPREAD + (las if preemptible else 0)

    def start(self, i: int, now: float) -> None:
        self.run_started[i] = now

    def fold(self, i: int, now: float, gpus: float) -> None:
        """A running job's GPUs change at ``now``: count its service so far at the old ``gpus``."""
        started = self.run_started.get(i)
        if started is not None:
            self.attained_gpu_s[i] += gpus * (now - started)
            self.run_started[i] = now

    def stop(self, i: int, now: float, gpus: float) -> None:
        started = self.run_started.pop(i, None)
        if started is not None:
            self.attained_gpu_s[i] += gpus * (now - started)

    def recheck_delays(self, i: int, gpus: float) -> list[float]:
        """Seconds from its run start (or last resize) until job ``i``, holding ``gpus``, drops a LAS level."""
        return demotion_delays_s(self.attained_gpu_s[i], gpus, self.thresholds)
