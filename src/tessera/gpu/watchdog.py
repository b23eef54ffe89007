"""The NVML memory watchdog: stops a workload whose processes hold more device memory than its allowance.

A shared GPU's memory cap is otherwise advisory (frameworks read it themselves), so one workload could starve
its neighbours; the watchdog makes the cap stick after the fact and stops only the offender. The node agent
calls ``Watchdog.check_once`` periodically with each running workload's allowance (see
``tessera.gpu.isolation.memory_allowance_mib``) and which PIDs belong to which workload.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from tessera.gpu.gpus import ProcessMemory, ProcessMemoryProbe

logger = logging.getLogger(__name__)

# Slack over the allowance before a workload counts as over it. Frameworks cap their allocator, but the CUDA
# context itself (a few hundred MiB, more with cuDNN/cuBLAS workspaces) comes on top and shows in NVML's figure.
DEFAULT_TOLERANCE_MIB = 512


@dataclass(frozen=True, slots=True)
class Violation:
    workload_id: str
    gpu_uuid: str
    used_mib: int  # summed over the workload's processes on that GPU
    allowance_mib: int
    pids: tuple[int, ...]
    tolerance_mib: int = DEFAULT_TOLERANCE_MIB  # the slack the limit included: over allowance_mib + tolerance_mib

    @property
    def reason(self) -> str:
        """The limit as applied: the allowance plus the slack (so 'over' reads true for a figure just above it)."""
        limit = f"its allowance of {self.allowance_mib} MiB"
        if self.tolerance_mib:
            limit += f" + {self.tolerance_mib} MiB slack"
        return (
            f"GPU memory {self.used_mib} MiB on {self.gpu_uuid} exceeds {limit} "
            f"(processes {', '.join(map(str, self.pids))})"
        )


def detect_overuse(
    per_process_usage: Sequence[ProcessMemory],
    allowances: Mapping[str, int],
    workload_by_pid: Mapping[int, str],
    tolerance_mib: int = DEFAULT_TOLERANCE_MIB,
) -> list[Violation]:
    """Workloads holding more than ``allowance + tolerance_mib`` on some GPU, one violation per (workload, GPU).

    A workload's processes on one GPU are summed. Processes of no known workload, and workloads with no
    allowance (absent or 0: not capped), are left alone. Sorted by workload, then GPU.
    """
    used: dict[tuple[str, str], int] = defaultdict(int)
    pids: dict[tuple[str, str], list[int]] = defaultdict(list)
    for process in per_process_usage:
        workload_id = workload_by_pid.get(process.pid)
        if workload_id is None or allowances.get(workload_id, 0) <= 0:
            continue
        key = (workload_id, process.gpu_uuid)
        used[key] += process.used_mib
        pids[key].append(process.pid)
    return [
        Violation(
            workload_id,
            gpu_uuid,
            used_mib,
            allowances[workload_id],
            tuple(sorted(pids[workload_id, gpu_uuid])),
            tolerance_mib,
        )
        for (workload_id, gpu_uuid), used_mib in sorted(used.items())
        if used_mib > allowances[workload_id] + tolerance_mib
    ]


class Watchdog:
    """Reads per-process GPU memory from ``probe`` and calls ``kill(workload_id, reason)`` for each offender."""

    def __init__(
        self,
        probe: ProcessMemoryProbe,
        kill: Callable[[str, str], None],
        tolerance_mib: int = DEFAULT_TOLERANCE_MIB,
    ) -> None:
        self._probe = probe
        self._kill = kill
        self._tolerance_mib = tolerance_mib

    def check_once(self, allowances: Mapping[str, int], workload_by_pid: Mapping[int, str]) -> list[Violation]:
        """One pass: find the offenders and stop each once (even when over on several GPUs); returns them all."""
        violations = detect_overuse(self._probe.process_memory(), allowances, workload_by_pid, self._tolerance_mib)
        stopped: set[str] = set()
        for violation in violations:
            if violation.workload_id in stopped:
                continue
            stopped.add(violation.workload_id)
            logger.warning("stopping workload %s: %s", violation.workload_id, violation.reason)
            try:
                self._kill(violation.workload_id, violation.reason)
            except Exception:  # one failed stop must not shield the other offenders
                logger.exception("could not stop workload %s", violation.workload_id)
        return violations
