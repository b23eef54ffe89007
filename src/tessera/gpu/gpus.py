"""GPU discovery: the devices of this host from NVML, or a declared simulated pool (``4xA100-80GB,2xT4``).

Simulated GPUs carry ``simulated=True`` and a UUID starting with ``SIM-``, so every view can label them.
This module holds the seam types (``GpuDevice``, ``GpuUsage``, ``ProcessMemory``, ``ProcessUtilization``, the
``GpuProbe``, ``ProcessMemoryProbe`` and ``ProcessUsageProbe`` protocols), the pool-spec parser and
``SimulatedProbe``. The NVML implementation lives in ``tessera.gpu.nvml``; ``tessera.gpu.discovery.detect_gpus``
picks one of the two for a node.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from tessera.core.catalog import all_models, model_names, resolve_model
from tessera.core.errors import InvalidRequestError, UnknownGpuModelError

SIMULATED_UUID_PREFIX = "SIM-"
MAX_SIMULATED_GPUS_PER_NODE = 256  # guards against typos such as "40000xT4"


@dataclass(frozen=True, slots=True)
class GpuDevice:
    index: int  # position on its node (0..n-1)
    uuid: str  # "GPU-..." from NVML (or "MIG-..."), "SIM-..." for a simulated GPU
    model: str  # canonical catalog model name (tessera.core.catalog), e.g. "A100-80GB"
    mem_mib: int  # device memory
    simulated: bool
    node: str = "local"  # the node (host) it belongs to
    product_name: str = ""  # the driver's name, e.g. "NVIDIA A100-SXM4-80GB MIG 1g.10gb" ("" when simulated)
    mig_parent_uuid: str = ""  # for a MIG instance, the UUID of the GPU it is carved from; "" otherwise

    @property
    def is_mig(self) -> bool:
        return bool(self.mig_parent_uuid)


@dataclass(frozen=True, slots=True)
class GpuUsage:
    uuid: str
    util_pct: float  # SM utilisation over the last sample period (NaN when the driver cannot say, e.g. under MIG)
    mem_used_mib: int
    mem_total_mib: int
    power_w: float  # NaN when the driver cannot say
    gpu_index: int = -1  # NVML index of the physical GPU (-1 = unknown)
    product_name: str = ""  # the driver's name of the physical GPU


@dataclass(frozen=True, slots=True)
class ProcessMemory:
    """Device memory one process holds on one GPU (or MIG instance)."""

    pid: int
    gpu_uuid: str
    used_mib: int


@dataclass(frozen=True, slots=True)
class ProcessUtilization:
    """How busy one process kept one GPU's SMs (NVML's per-process samples, averaged since the last reading)."""

    pid: int
    gpu_uuid: str
    sm_pct: float


class GpuProbe(Protocol):
    def devices(self) -> list[GpuDevice]:
        """The GPUs to schedule on (fixed for the life of the server)."""
        ...

    def usage(self) -> list[GpuUsage]:
        """A fresh usage sample per real GPU; empty for a simulated pool."""
        ...


class ProcessMemoryProbe(Protocol):
    def process_memory(self) -> list[ProcessMemory]:
        """Device memory held by each compute process on each GPU now; empty for a simulated pool."""
        ...


class ProcessUsageProbe(ProcessMemoryProbe, Protocol):
    def process_utilization(self) -> list[ProcessUtilization]:
        """SM utilisation of each compute process on each GPU since the last call; empty for a simulated pool."""
        ...


class SimulatedProbe:
    """A declared pool of GPUs that do not exist: they schedule like real ones and report no usage."""

    def __init__(self, devices: Sequence[GpuDevice]) -> None:
        self._devices = list(devices)

    def devices(self) -> list[GpuDevice]:
        return list(self._devices)

    def usage(self) -> list[GpuUsage]:
        return []

    def process_memory(self) -> list[ProcessMemory]:
        return []

    def process_utilization(self) -> list[ProcessUtilization]:
        return []


_ENTRY = re.compile(r"^(?:(?P<count>\d+)\s*[xX]\s*)?(?P<model>\S.*)$")


def parse_gpu_spec(spec: str, node: str = "local") -> list[GpuDevice]:
    """The simulated GPUs a pool spec declares, e.g. ``4xA100-80GB,2xT4`` or ``A100-80GB`` (count defaults to 1).

    Model names resolve through the catalog (case-insensitive, aliases accepted). Devices are indexed in spec
    order; each gets the stable UUID ``SIM-<node>-<model>-<index>``. Raises ``InvalidRequestError("gpus", ...)``
    naming the bad entry.
    """
    entries = spec.split(",")
    if not spec.strip():
        raise InvalidRequestError("gpus", f"empty GPU spec; write e.g. '4xA100-80GB,2xT4' (known: {_known()})")
    devices: list[GpuDevice] = []
    for entry in entries:
        count, model_name, mem_mib = _parse_entry(entry.strip(), spec)
        for _ in range(count):
            index = len(devices)
            uuid = f"{SIMULATED_UUID_PREFIX}{_safe(node)}-{model_name}-{index}"
            devices.append(GpuDevice(index, uuid, model_name, mem_mib, simulated=True, node=node))
    if len(devices) > MAX_SIMULATED_GPUS_PER_NODE:
        raise InvalidRequestError(
            "gpus", f"{spec!r} declares {len(devices)} GPUs; at most {MAX_SIMULATED_GPUS_PER_NODE} per node"
        )
    return devices


def _parse_entry(entry: str, spec: str) -> tuple[int, str, int]:
    match = _ENTRY.match(entry)
    if match is None:
        raise InvalidRequestError("gpus", f"empty entry in {spec!r}; entries are '<count>x<model>' or '<model>'")
    count = int(match["count"]) if match["count"] is not None else 1
    if count < 1:
        raise InvalidRequestError("gpus", f"{entry!r}: the count must be at least 1")
    name = match["model"].strip()
    try:
        model = resolve_model(name)
    except UnknownGpuModelError:
        raise InvalidRequestError("gpus", f"{entry!r}: {_unknown_model_hint(name)}") from None
    return count, model.name, model.mem_mib


def _unknown_model_hint(name: str) -> str:
    family = [m.name for m in all_models() if m.family.upper() == name.strip().upper()]
    if family:
        return f"{name!r} is a GPU family; name one model ({', '.join(family)})"
    return f"unknown GPU model {name!r} (known: {_known()})"


def _known() -> str:
    return ", ".join(model_names())


def _safe(node: str) -> str:
    """``node`` made safe inside a UUID that goes into a comma-separated CUDA_VISIBLE_DEVICES."""
    return re.sub(r"[^A-Za-z0-9_.-]", "-", node) or "node"
