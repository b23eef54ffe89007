"""Discretised least-attained-service (LAS) priorities, as in Tiresias (Gu et al., NSDI '19).

A job's *attained service* is the GPU time it has received so far: GPUs held × seconds run (its "two-dimensional"
age, so a wide job ages as fast as its width). Thresholds split the service axis into a few queues; queue 0 (least
service) is served first, FIFO within a queue. ``las_priority`` maps a job to a scheduler priority (larger first:
``-queue``), so the ordinary ordering (priority, then arrival) and the within-queue preemption by priority of
``core.preemption`` implement the policy without a special step. Called by the timeline simulator's ``tiresias``
baseline; pure.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence

from tessera.core.errors import InvalidRequestError

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
