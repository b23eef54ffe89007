"""The NVML memory watchdog in the control plane: every few seconds, the device memory of each running workload's
processes (as its backend lists them, ``Backend.pids``: for the local backend, all of its process group) is compared
with its allowance (its stated ``gpu_mem_mib``, else its share of the GPU's memory); a workload over it is stopped,
and only that one. Runs only on real GPUs read through NVML.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from tessera.backends.base import Handle
from tessera.gpu.gpus import GpuDevice, ProcessMemoryProbe
from tessera.gpu.isolation import memory_allowance_mib
from tessera.gpu.watchdog import Watchdog


@dataclass(frozen=True, slots=True)
class Watched:
    """What the watchdog needs of one running workload."""

    workload_id: str
    handle: Handle
    devices: tuple[GpuDevice, ...]
    gpu_milli: int
    gpu_mem_mib: int


class MemoryWatch:
    def __init__(
        self,
        probe: ProcessMemoryProbe,
        stop: Callable[[str, str], None],
        pids: Callable[[Handle], list[int]],
        interval_s: float = 2.0,
    ) -> None:
        """``pids``: a workload's live processes on this host (``Backend.pids``); NVML reports the CUDA process,
        which is one of them (a descendant of what was launched)."""
        self.watchdog = Watchdog(probe, stop)
        self.interval_s = interval_s
        self.pids = pids
        self._last_s = float("-inf")

    def check(self, now_s: float, running: Iterable[Watched]) -> None:
        if now_s - self._last_s < self.interval_s:
            return
        self._last_s = now_s
        allowances: dict[str, int] = {}
        workload_by_pid: dict[int, str] = {}
        for watched in running:
            allowance = memory_allowance_mib(watched.devices, watched.gpu_milli, watched.gpu_mem_mib)
            if allowance <= 0:
                continue
            allowances[watched.workload_id] = allowance
            for pid in self.pids(watched.handle):
                workload_by_pid[pid] = watched.workload_id
        if allowances:
            self.watchdog.check_once(allowances, workload_by_pid)
