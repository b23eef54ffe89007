"""What is asked (``Request``), who asks (``Workload``) and where it went (``Placement``).

A request speaks the ecosystem's words: ``num_gpus`` GPUs, each shared by ``gpu_milli`` thousandths
(1000 = a whole GPU) and/or ``gpu_mem_mib`` of device memory, allowed GPU types, CPU and host memory.
Only a single-GPU request may take a fraction of a GPU; multi-GPU requests take whole GPUs.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from tessera.core.errors import InvalidRequestError

MILLI_PER_GPU = 1000
MAX_GPUS_PER_REQUEST = 64
# Like Kubernetes, scoring treats a request of no CPU as this much so that "free" pods still weigh something.
NONZERO_CPU_MILLI = 100


@dataclass(frozen=True, slots=True)
class Request:
    num_gpus: int = 0  # GPUs wanted; 0 for a CPU-only workload
    gpu_milli: int = 0  # share of each GPU in thousandths; < 1000 only when num_gpus == 1
    gpu_mem_mib: int = 0  # device memory per GPU (0 = not stated); becomes milli once a GPU is chosen
    gpu_types: frozenset[str] = frozenset()  # canonical allowed GPU models; empty = any
    cpu_milli: int = 0  # host CPU in thousandths of a core
    mem_mib: int = 0  # host memory
    priority: int = 0  # larger runs first (used by queueing)
    queue: str = "default"  # tenant queue
    job_type: str = ""  # model family for throughput models, e.g. "resnet50" ("" = unknown)

    def __post_init__(self) -> None:
        _require_non_negative("num_gpus", self.num_gpus)
        _require_non_negative("gpu_milli", self.gpu_milli)
        _require_non_negative("gpu_mem_mib", self.gpu_mem_mib)
        _require_non_negative("cpu_milli", self.cpu_milli)
        _require_non_negative("mem_mib", self.mem_mib)
        if self.num_gpus > MAX_GPUS_PER_REQUEST:
            raise InvalidRequestError("num_gpus", f"{self.num_gpus} exceeds {MAX_GPUS_PER_REQUEST}")
        if self.gpu_milli > MILLI_PER_GPU:
            raise InvalidRequestError("gpu_milli", f"{self.gpu_milli} is over {MILLI_PER_GPU} (one whole GPU)")
        if self.num_gpus > 1 and 0 < self.gpu_milli < MILLI_PER_GPU:
            raise InvalidRequestError("gpu_milli", "a fraction of a GPU is only allowed for a 1-GPU request")
        if self.num_gpus == 0 and (self.gpu_milli or self.gpu_mem_mib):
            raise InvalidRequestError("num_gpus", "0 GPUs requested but a GPU share was given")
        if self.num_gpus > 0 and self.gpu_milli == 0 and self.gpu_mem_mib == 0:
            raise InvalidRequestError("gpu_milli", "a GPU request needs gpu_milli or gpu_mem_mib")

    @property
    def is_sharing(self) -> bool:
        """A single GPU taken only in part: it may share its GPU with others."""
        return self.num_gpus == 1 and 0 < self.gpu_milli < MILLI_PER_GPU

    @property
    def total_gpu_milli(self) -> int:
        return self.num_gpus * self.gpu_milli

    @property
    def scoring_cpu_milli(self) -> int:
        """CPU as scoring policies see it: never zero (the Kubernetes non-zero default)."""
        return self.cpu_milli or NONZERO_CPU_MILLI

    @property
    def kind(self) -> str:
        """Coarse kind of request: ``cpu``, ``share`` (part of one GPU) or ``N-gpu`` (N whole GPUs)."""
        if self.num_gpus == 0:
            return "cpu"
        return "share" if self.is_sharing else f"{self.num_gpus}-gpu"


def _require_non_negative(name: str, value: int) -> None:
    if value < 0:
        raise InvalidRequestError(name, f"must be >= 0, got {value}")


class WorkloadState(enum.Enum):
    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    PREEMPTED = "preempted"


@dataclass(frozen=True, slots=True)
class Workload:
    id: str
    request: Request
    name: str = ""
    state: WorkloadState = WorkloadState.PENDING


@dataclass(frozen=True, slots=True)
class Placement:
    """A decision: ``request`` bound to GPUs ``gpu_indices`` of node ``node`` (index into the cluster)."""

    node: int
    gpu_indices: tuple[int, ...]
    request: Request
    gpu_milli_each: int = field(default=0)  # milli taken on each GPU in gpu_indices

    @property
    def total_gpu_milli(self) -> int:
        return self.gpu_milli_each * len(self.gpu_indices)
