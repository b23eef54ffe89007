"""A fake NVML for tests and demos on machines without a GPU: ``FakeNvml`` has the ``pynvml`` function names
that ``NvmlProbe`` and ``detect_gpus`` call and answers from a declared list of ``FakeGpu``.

It mimics NVML's behaviour where it matters to callers: memory in bytes, power in milliwatts, ``NVMLError`` for
a MIG query on a GPU without MIG, for utilisation on a MIG-enabled GPU and for an empty MIG slot.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

BYTES_PER_MIB = 1024 * 1024
MAX_MIG_DEVICES = 7  # what NVML reports for A100/H100


class FakeNvmlError(Exception):
    """Stands for ``pynvml.NVMLError``."""


@dataclass
class FakeGpu:
    """One GPU (or one MIG instance, inside ``FakeGpu.mig``) as the fake driver reports it."""

    name: str  # e.g. "NVIDIA A100-SXM4-80GB"
    mem_total_mib: int
    uuid: str
    mem_used_mib: int = 0
    util_pct: int = 0
    power_mw: int = 0
    mig: list[FakeGpu] | None = None  # MIG instances when MIG mode is on; None: the GPU does not support MIG
    mig_enabled: bool = False
    processes: list[tuple[int, int]] = field(default_factory=list)  # (pid, used MiB)
    process_samples: list[tuple[int, int, int]] = field(default_factory=list)  # (pid, timestamp µs, SM %)


class FakeNvml:
    """An initialised NVML over ``gpus``; ``init_error`` makes ``nvmlInit`` fail like a host with no driver."""

    NVMLError = FakeNvmlError

    def __init__(self, gpus: list[FakeGpu], init_error: str | None = None) -> None:
        self.gpus = gpus
        self.init_error = init_error
        self.initialised = False

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise FakeNvmlError(self.init_error)
        self.initialised = True

    def nvmlShutdown(self) -> None:
        self.initialised = False

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpu:
        if not 0 <= index < len(self.gpus):
            raise FakeNvmlError("Invalid Argument")
        return self.gpus[index]

    def nvmlDeviceGetUUID(self, handle: FakeGpu) -> str:
        return handle.uuid

    def nvmlDeviceGetName(self, handle: FakeGpu) -> str:
        return handle.name

    def nvmlDeviceGetMemoryInfo(self, handle: FakeGpu) -> SimpleNamespace:
        total, used = handle.mem_total_mib * BYTES_PER_MIB, handle.mem_used_mib * BYTES_PER_MIB
        return SimpleNamespace(total=total, used=used, free=total - used)

    def nvmlDeviceGetUtilizationRates(self, handle: FakeGpu) -> SimpleNamespace:
        if handle.mig_enabled:
            raise FakeNvmlError("Not Supported")
        return SimpleNamespace(gpu=handle.util_pct, memory=0)

    def nvmlDeviceGetPowerUsage(self, handle: FakeGpu) -> int:
        return handle.power_mw

    def nvmlDeviceGetMigMode(self, handle: FakeGpu) -> list[int]:
        if handle.mig is None:
            raise FakeNvmlError("Not Supported")
        mode = int(handle.mig_enabled)
        return [mode, mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: FakeGpu) -> int:
        return MAX_MIG_DEVICES if handle.mig is not None else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: FakeGpu, index: int) -> FakeGpu:
        if handle.mig is None or not 0 <= index < len(handle.mig):
            raise FakeNvmlError("Not Found")
        return handle.mig[index]

    def nvmlDeviceGetComputeRunningProcesses(self, handle: FakeGpu) -> list[SimpleNamespace]:
        return [SimpleNamespace(pid=pid, usedGpuMemory=used_mib * BYTES_PER_MIB) for pid, used_mib in handle.processes]

    def nvmlDeviceGetProcessUtilization(self, handle: FakeGpu, last_seen_us: int) -> list[SimpleNamespace]:
        if handle.mig_enabled:
            raise FakeNvmlError("Not Supported")
        fresh = [
            SimpleNamespace(pid=p, timeStamp=t, smUtil=sm) for p, t, sm in handle.process_samples if t > last_seen_us
        ]
        if not fresh:
            raise FakeNvmlError("Not Found")
        return fresh
