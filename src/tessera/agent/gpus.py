"""GPU discovery: the devices of this host from NVML, or a declared simulated pool (``4xA100-80GB,2xT4``).

Simulated GPUs carry ``simulated=True`` and a UUID starting with ``SIM-``, so every view can label them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class GpuDevice:
    index: int  # position on its node (0..n-1)
    uuid: str  # "GPU-..." from NVML (or "MIG-..."), "SIM-..." for a simulated GPU
    model: str  # canonical catalog model name (tessera.core.catalog), e.g. "A100-80GB"
    mem_mib: int  # device memory
    simulated: bool
    node: str = "local"  # the node (host) it belongs to


@dataclass(frozen=True, slots=True)
class GpuUsage:
    uuid: str
    util_pct: float  # SM utilisation over the last sample period
    mem_used_mib: int
    mem_total_mib: int
    power_w: float


class GpuProbe(Protocol):
    def devices(self) -> list[GpuDevice]:
        """The GPUs to schedule on (fixed for the life of the server)."""
        ...

    def usage(self) -> list[GpuUsage]:
        """A fresh usage sample per real GPU; empty for a simulated pool."""
        ...
