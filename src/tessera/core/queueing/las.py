"""Discretised least-attained-service (LAS) priorities, as in Tiresias (Gu et al., NSDI '19).

A job's *attained service* is the GPU time it has received so far: GPUs held × seconds run (its "two-dimensional"
age, so a wide job ages as fast as its width). Thresholds split the service axis into a few queues; queue 0 (least
service) is served first, FIFO within a queue. ``las_priority`` maps a job to a scheduler priority (larger first:
``-queue``), so the ordinary ordering (priority, then arrival) and the within-queue preemption by priority of
``core.preemption`` implement the policy without a special step. Called by the timeline simulator's ``tiresias``
baseline; pure.
"""

from __future__ import annotations

import dataclasses
from bisect import bisect_right
from collections.abc import Sequence

from tessera.core.errors import InvalidRequestError
from tessera.core.preemption import PreemptionGuard

SECONDS_PER_HOUR = 3600.0
# 1 GPU-hour and 10 GPU-hours: three queues (short, medium, long), the order of magnitude Tiresias uses on its trace.
TIRESIAS_THRESHOLDS_GPU_S: tuple[float, ...] = (1.0 * SECONDS_PER_HOUR, 10.0 * SECONDS_PER_HOUR)


def check_thresholds(thresholds_gpu_s: Sequence[float]) -> None:
    if any(t <= 0 for t in thresholds_gpu_s) or list(thresholds_gpu_s) != sorted(set(thresholds_gpu_s)):
        raise InvalidRequestError("las_thresholds_gpu_s", f"must be positive and increasing, got {thresholds_gpu_s}")


def las_queue(attained_gpu_s: float, thresholds_gpu_s: Sequence[float]) -> int:
    """The LAS queue of a job with ``attained_gpu_s`` of service: how many thresholds it has reached (0 = first)."""
    return bisect_right(thresholds_gpu_s, attained_gpu_s)


def las_priority(attained_gpu_s: float, thresholds_gpu_s: Sequence[float]) -> int:
    """The scheduler priority (larger first) of a job with ``attained_gpu_s`` of service."""
    return -las_queue(attained_gpu_s, thresholds_gpu_s)


def demotion_delays_s(attained_gpu_s: float, gpus: float, thresholds_gpu_s: Sequence[float]) -> list[float]:
    """Seconds from now at which a job running on ``gpus`` GPUs crosses each threshold still ahead of it."""
    if gpus <= 0:
        return []
    return [(t - attained_gpu_s) / gpus for t in thresholds_gpu_s if t > attained_gpu_s]


LAS_CLASS_SPREAD = 10  # more than the number of LAS levels: a class never falls below the next one
LAS_EPSILON_GPU_S = 1e-6  # a recheck lands exactly on a threshold: count it as reached despite rounding


def class_guard(guard: PreemptionGuard | None, within_class: bool) -> PreemptionGuard | None:
    """The guard a step applies. Under LAS within classes every run is guarded, against LAS churn: levels change as
    service is attained, so a workload preempted now could soon preempt back. Class priorities never change, so a
    strictly higher class (``inference-critical`` over ``training``) is not held back by it and preempts at once
    (``PreemptionGuard.class_spread``); the no-loop rule of ``core.preemption`` does not depend on the guard."""
    if guard is None or not within_class:
        return guard
    return dataclasses.replace(guard, class_spread=LAS_CLASS_SPREAD)


class LasService:
    """Attained service of every workload (GPU-seconds, summed over its runs) and the LAS priority it gives.

    The service is kept up to each running workload's current run start (or last resize); ``priority`` adds the run
    so far. Plain LAS (tiresias) makes the LAS level the priority; ``within_class`` (tessera) keeps the workload's
    priority class first and orders only preemptible workloads of one class by LAS level. Owned by the scheduler's
    books (``core.allocation``); ``recheck_delays`` tells a runtime when a running workload will drop a level.
    """

    def __init__(self, thresholds_gpu_s: tuple[float, ...], within_class: bool) -> None:
        check_thresholds(thresholds_gpu_s)
        if within_class and len(thresholds_gpu_s) >= LAS_CLASS_SPREAD:  # a level would reach the class below
            most = LAS_CLASS_SPREAD - 1
            raise InvalidRequestError("las_thresholds_gpu_s", f"at most {most} within classes, got {thresholds_gpu_s}")
        self.thresholds = thresholds_gpu_s
        self.within_class = within_class
        self.attained_gpu_s: dict[str, float] = {}  # up to the current run's start (or last resize)
        self.run_started: dict[str, float] = {}  # when each running workload's current run started (or was resized)

    def priority(self, workload_id: str, now_s: float, gpus: float, base_priority: int, preemptible: bool) -> int:
        """The priority at ``now_s`` of a workload of class ``base_priority`` holding (or asking for) ``gpus``."""
        attained = self.attained_gpu_s.get(workload_id, 0.0)
        started = self.run_started.get(workload_id)
        if started is not None:
            attained += gpus * (now_s - started)
        las = las_priority(attained + LAS_EPSILON_GPU_S, self.thresholds)
        if not self.within_class:
            return las
        # Classes are far apart (e.g. 1000, 100, 0); LAS levels (0, -1, -2) order workloads within one class.
        return base_priority * LAS_CLASS_SPREAD + (las if preemptible else 0)

    def start(self, workload_id: str, now_s: float) -> None:
        self.run_started[workload_id] = now_s

    def fold(self, workload_id: str, now_s: float, gpus: float) -> None:
        """A running workload's GPUs change at ``now_s``: count its service so far at the old ``gpus``."""
        started = self.run_started.get(workload_id)
        if started is not None:
            self._add(workload_id, gpus * (now_s - started))
            self.run_started[workload_id] = now_s

    def stop(self, workload_id: str, now_s: float, gpus: float) -> None:
        started = self.run_started.pop(workload_id, None)
        if started is not None:
            self._add(workload_id, gpus * (now_s - started))

    def recheck_delays(self, workload_id: str, gpus: float) -> list[float]:
        """Seconds from its run start (or last resize) until the workload, holding ``gpus``, drops a LAS level."""
        return demotion_delays_s(self.attained_gpu_s.get(workload_id, 0.0), gpus, self.thresholds)

    def _add(self, workload_id: str, gpu_s: float) -> None:
        self.attained_gpu_s[workload_id] = self.attained_gpu_s.get(workload_id, 0.0) + gpu_s
