"""``TimelineJob``: one job of a timeline workload, as the workload generators hand it to the timeline simulator.

Built by the workload generators of ``tessera.sim.workloads`` (``openb``, ``training``, ``tenants``, ``files``); read
by the replay (``tessera.sim.replay.timeline``).
A job runs either for a fixed time (``duration_s``, from a trace) or until it has done ``work_steps`` steps at the
throughput of the GPU type it got (``ThroughputModel.throughput(job_type, gpu_model)``, slowed by co-location).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from tessera.core.errors import InvalidRequestError
from tessera.core.workload import MILLI_PER_GPU, Request

# Priority classes (larger runs first): latency-critical inference > training > best-effort.
PRIORITY_INFERENCE = 1000
PRIORITY_TRAINING = 100
PRIORITY_BEST_EFFORT = 0
PRIORITY_CLASSES: dict[str, int] = {
    "inference-critical": PRIORITY_INFERENCE,
    "training": PRIORITY_TRAINING,
    "best-effort": PRIORITY_BEST_EFFORT,
}

# Gavel's scale-factor distribution (its Philly-derived job generator): (GPUs of the job, probability).
SCALE_FACTORS: tuple[tuple[int, float], ...] = ((1, 0.70), (2, 0.10), (4, 0.15), (8, 0.05))
TRAINING_WORKER_CPU_MILLI = 4000  # host CPU of one 1-GPU training worker
TRAINING_WORKER_MEM_MIB = 16 * 1024  # host memory of one 1-GPU training worker


@dataclass(frozen=True, slots=True)
class TimelineJob:
    """A job of a timeline workload: when it comes, what each worker asks for and how long it needs."""

    id: str  # unique within a workload
    arrival_s: float  # submission time, seconds from the workload's start (traces keep their own origin)
    request: Request  # what ONE worker asks for; its queue and priority equal the job's
    duration_s: float | None  # fixed runtime (trace deletion − creation); None when computed from work_steps
    job_type: str | None = None  # throughput / co-location model key (e.g. "ResNet-50"); None for trace pods
    # Total steps of the whole job; runtime on GPU type m with all ``gang`` workers =
    # work_steps / throughput_model.throughput(job_type, m) (the reference runtime is calibrated for the full gang).
    work_steps: float | None = None
    queue: str = "default"  # tenant queue
    priority: int = 0  # larger first; see PRIORITY_CLASSES
    preemptible: bool = False  # may be stopped to make room for higher-priority or reclaiming work
    gang: int = 1  # workers of ``request`` started all or nothing (1 = a single worker)
    elastic_min: int | None = None  # elastic jobs: fewest workers it can run with (None = rigid)
    elastic_max: int | None = None  # elastic jobs: most workers it can use (None = rigid)
    checkpointed: bool = False  # a preempted run resumes from its last checkpoint instead of from the start

    def __post_init__(self) -> None:
        if not self.id:
            raise InvalidRequestError("id", "a job needs an id")
        if not (math.isfinite(self.arrival_s) and self.arrival_s >= 0):
            raise InvalidRequestError("arrival_s", f"job {self.id}: must be a finite number >= 0")
        if (self.duration_s is None) == (self.work_steps is None):
            raise InvalidRequestError("duration_s", f"job {self.id}: give exactly one of duration_s and work_steps")
        if self.duration_s is not None and not (math.isfinite(self.duration_s) and self.duration_s >= 0):
            raise InvalidRequestError("duration_s", f"job {self.id}: must be a finite number >= 0")
        if self.work_steps is not None:
            if not (math.isfinite(self.work_steps) and self.work_steps > 0):
                raise InvalidRequestError("work_steps", f"job {self.id}: must be a finite number > 0")
            if not self.job_type:
                raise InvalidRequestError("job_type", f"job {self.id}: work_steps needs a job_type")
        if self.gang < 1:
            raise InvalidRequestError("gang", f"job {self.id}: must be >= 1, got {self.gang}")
        self._check_elastic()

    def _check_elastic(self) -> None:
        low, high = self.elastic_min, self.elastic_max
        if low is None or high is None:
            if low is not None or high is not None:
                raise InvalidRequestError("elastic_min", f"job {self.id}: give both elastic_min and elastic_max")
            return
        if not 1 <= low <= self.gang <= high:
            raise InvalidRequestError("elastic_min", f"job {self.id}: need 1 <= elastic_min <= gang <= elastic_max")

    @property
    def is_elastic(self) -> bool:
        return self.elastic_min is not None

    @property
    def total_gpu_milli(self) -> int:
        """GPU milli of all ``gang`` workers together."""
        return self.gang * self.request.total_gpu_milli


def training_worker(queue: str, priority: int = PRIORITY_TRAINING) -> Request:
    """What one worker of a training gang asks for: a whole GPU, 4 cores, 16 GiB."""
    return Request(
        num_gpus=1,
        gpu_milli=MILLI_PER_GPU,
        cpu_milli=TRAINING_WORKER_CPU_MILLI,
        mem_mib=TRAINING_WORKER_MEM_MIB,
        priority=priority,
        queue=queue,
    )


def elastic_range(gang: int, elastic: bool) -> tuple[int | None, int | None]:
    """``(elastic_min, elastic_max)`` of a training gang: half to twice its size when elastic, else fixed."""
    return (max(1, gang // 2), 2 * gang) if elastic else (None, None)


def scale_factors(rng: np.random.Generator, count: int, total_gpus: int) -> npt.NDArray[np.int64]:
    """``count`` gang sizes from ``SCALE_FACTORS``, capped at the largest power of two <= ``total_gpus``."""
    sizes = np.array([size for size, _ in SCALE_FACTORS], dtype=np.int64)
    weights = np.array([p for _, p in SCALE_FACTORS], dtype=np.float64)
    drawn = sizes[rng.choice(len(sizes), size=count, p=weights / weights.sum())]
    cap = 1 << (total_gpus.bit_length() - 1)  # the largest power of two <= total_gpus
    return np.minimum(drawn, cap)
