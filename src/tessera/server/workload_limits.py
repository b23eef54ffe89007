"""What every workload of a server is held to besides its request (``tessera up --workload-pids-max``,
``--workload-mem-per-gpu``, ``--log-max-size``), and the memory limit of one workload. The launcher puts the result
in the ``LaunchSpec``; the backend enforces it (the local one in the workload's cgroups: ``backends.cgroup_limits``).

- **Processes**: ``pids_max`` processes and threads per workload (default ``DEFAULT_PIDS_MAX``; 0: none; at most
  the kernel's ``MAX_PIDS_MAX``). A fork bomb stops there, whatever the workload asked for.
- **Memory**: the request's ``mem_mib`` (``tessera submit --mem``) when given. Else ``mem_per_gpu_mib`` times the
  GPUs it is on, whatever its share of each (one without GPUs counts as one GPU), at least ``MIN_DEFAULT_MEM_MIB``;
  ``mem_per_gpu_mib`` 0 (the default) means the node's memory divided by its GPUs (all of it on a node without
  GPUs). Never more than the node's memory. A fraction of a GPU gets the whole GPU's part: what a process needs of
  host memory (its framework, the CUDA context, pinned buffers, an engine's CPU-side cache) does not shrink with its
  compute share, so the sharers of one GPU may together hold more than its part (up to the node's memory).
- **CPU**: the request's ``cpu_milli`` (``--cpu``) as a quota and a weight; without one, no quota.
"""

from __future__ import annotations

from dataclasses import dataclass

from tessera.backends.capped_log import DEFAULT_LOG_MAX_BYTES
from tessera.errors import InvalidRequestError

DEFAULT_PIDS_MAX = 4096
MIN_PIDS_MAX = 8  # the workload's supervisor is 2 of them (its thread copies the log)
MAX_PIDS_MAX = 4_194_304  # the kernel's ceiling (PID_MAX_LIMIT): pids.max refuses more, which left no limit at all
MIN_DEFAULT_MEM_MIB = 1024


@dataclass(frozen=True, slots=True)
class WorkloadLimits:
    pids_max: int = DEFAULT_PIDS_MAX  # processes and threads per workload (0: no limit)
    mem_per_gpu_mib: int = 0  # host memory per GPU of share, without --mem (0: the node's memory / its GPUs)
    log_max_bytes: int = DEFAULT_LOG_MAX_BYTES  # a log file is rotated before it passes this (0: never)

    def __post_init__(self) -> None:
        if self.pids_max < 0 or 0 < self.pids_max < MIN_PIDS_MAX:
            why = f"must be 0 (no limit) or at least {MIN_PIDS_MAX} (the supervisor takes 2), got {self.pids_max}"
            raise InvalidRequestError("--workload-pids-max", why)
        if self.pids_max > MAX_PIDS_MAX:
            why = f"must be at most {MAX_PIDS_MAX} (the kernel's most processes; 0: no limit), got {self.pids_max}"
            raise InvalidRequestError("--workload-pids-max", why)
        if self.mem_per_gpu_mib < 0:
            raise InvalidRequestError("--workload-mem-per-gpu", f"must be >= 0, got {self.mem_per_gpu_mib}")
        if self.log_max_bytes < 0:
            raise InvalidRequestError("--log-max-size", f"must be >= 0 (0: no cap), got {self.log_max_bytes}")

    def memory_mib(self, requested_mib: int, gpu_count: int, node_mem_mib: int, node_gpus: int) -> int:
        """The memory limit of a workload that asked for ``requested_mib`` (0: nothing) and is on ``gpu_count``
        GPUs (any share of each) of a node of ``node_mem_mib`` and ``node_gpus``."""
        if requested_mib > 0:
            return requested_mib
        per_gpu_mib = self.mem_per_gpu_mib or node_mem_mib // max(1, node_gpus)
        default_mib = max(MIN_DEFAULT_MEM_MIB, per_gpu_mib * max(1, gpu_count))
        return min(default_mib, node_mem_mib) if node_mem_mib > 0 else default_mib
