"""The GPUs of this host as NVML reports them: ``NvmlProbe`` and the NVML-name to catalog-model mapping.

Used by ``tessera.gpu.discovery.detect_gpus`` when a driver is present. ``nvml`` is the ``pynvml`` module
(package ``nvidia-ml-py``), already initialised with ``nvmlInit()``, or any object with the same function names
(``tessera.gpu.fakes.FakeNvml`` in tests). Every call that a GPU may legitimately refuse (MIG queries on a GPU
without MIG, utilisation under MIG, power on some boards) is guarded: the answer becomes "no MIG" or NaN.
"""

from __future__ import annotations

import logging
import math
import re
from dataclasses import replace
from typing import Any, Protocol

from tessera.core.catalog import GpuModel, all_models
from tessera.gpu.gpus import GpuDevice, GpuUsage, ProcessMemory, ProcessUtilization

logger = logging.getLogger(__name__)

BYTES_PER_MIB = 1024 * 1024
MILLIWATTS_PER_WATT = 1000.0
NVML_DEVICE_MIG_ENABLE = 1  # pynvml.NVML_DEVICE_MIG_ENABLE
# Words in NVML names that say nothing about the model.
_NOISE_TOKENS = frozenset({"NVIDIA", "TESLA", "GEFORCE", "QUADRO"})


class NvmlApi(Protocol):
    """The slice of the NVML API Tessera calls (names as in ``pynvml``); handles are opaque."""

    @property
    def NVMLError(self) -> type[Exception]: ...  # the base class of every NVML error

    def nvmlDeviceGetCount(self) -> int: ...
    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any: ...
    def nvmlDeviceGetUUID(self, handle: Any) -> str | bytes: ...
    def nvmlDeviceGetName(self, handle: Any) -> str | bytes: ...
    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any: ...  # .total, .used, .free in bytes
    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any: ...  # .gpu in percent
    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int: ...  # milliwatts
    def nvmlDeviceGetMigMode(self, handle: Any) -> list[int]: ...  # [current, pending]
    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Any) -> int: ...
    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Any, index: int) -> Any: ...
    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]: ...  # .pid, .usedGpuMemory (bytes)
    # Samples since a timestamp (µs): .pid, .timeStamp, .smUtil (%); NVMLError (NOT_FOUND) when there are none.
    def nvmlDeviceGetProcessUtilization(self, handle: Any, last_seen_us: int) -> list[Any]: ...


def match_catalog_model(nvml_name: str, mem_mib: int) -> str:
    """The canonical catalog model for a GPU that NVML calls ``nvml_name`` with ``mem_mib`` of memory.

    Rules: (1) the name's words (``NVIDIA``/``Tesla``/``GeForce``/``Quadro`` dropped, split on spaces and dashes)
    or two adjacent words joined (``RTX 4090`` -> ``RTX4090``) must equal a catalog family (``A100``, ``T4``,
    ``L40S`` ...); within the family the model whose memory is closest to ``mem_mib`` wins (``A100-SXM4-40GB``
    -> ``A100-40GB``). (2) With no family in the name, the disclosed catalog model closest in memory is taken and
    a warning is logged. Undisclosed trace placeholders (``G2``, ``G3``) are never chosen.
    """
    candidates = [m for m in all_models() if m.disclosed]
    words = [w for w in re.split(r"[^A-Z0-9]+", nvml_name.upper()) if w and w not in _NOISE_TOKENS]
    keys = set(words) | {a + b for a, b in zip(words, words[1:], strict=False)}
    family = [m for m in candidates if m.family.upper() in keys or m.name.upper() in keys]
    if family:
        return _closest_by_memory(family, mem_mib).name
    guess = _closest_by_memory(candidates, mem_mib)
    logger.warning(
        "GPU %r (%d MiB) is not in the catalog; scheduling it as %s, the closest model by memory",
        nvml_name,
        mem_mib,
        guess.name,
    )
    return guess.name


def _closest_by_memory(models: list[GpuModel], mem_mib: int) -> GpuModel:
    return min(models, key=lambda m: abs(m.mem_mib - mem_mib))  # first in catalog order on a tie


class NvmlProbe:
    """The GPUs of this host from NVML; MIG-enabled GPUs contribute their MIG instances instead of themselves.

    Devices are read once, at construction (they are fixed for the life of the server), so an NVML failure
    surfaces here, where ``detect_gpus`` can fall back to a simulated pool.
    """

    def __init__(self, nvml: NvmlApi, node: str = "local") -> None:
        self._nvml = nvml
        self._node = node
        self._gpu_handles: list[Any] = []  # physical GPUs, by NVML index
        self._device_handles: list[tuple[GpuDevice, Any]] = []  # schedulable devices (whole GPUs or MIG)
        self._last_sample_us: dict[str, int] = {}  # device UUID -> newest per-process sample read
        for gpu_index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(gpu_index)
            self._gpu_handles.append(handle)
            self._add_gpu(handle)

    def devices(self) -> list[GpuDevice]:
        return [device for device, _ in self._device_handles]

    def usage(self) -> list[GpuUsage]:
        """One sample per physical GPU (MIG instances are not sampled apart: NVML has no utilisation for them)."""
        samples = []
        for gpu_index, handle in enumerate(self._gpu_handles):
            try:
                memory = self._nvml.nvmlDeviceGetMemoryInfo(handle)
                uuid, name = _text(self._nvml.nvmlDeviceGetUUID(handle)), _text(self._nvml.nvmlDeviceGetName(handle))
            except self._nvml.NVMLError as exc:
                logger.warning("NVML cannot sample GPU %d: %s", gpu_index, exc)
                continue
            samples.append(
                GpuUsage(
                    uuid=uuid,
                    util_pct=self._util_pct(handle),
                    mem_used_mib=int(memory.used) // BYTES_PER_MIB,
                    mem_total_mib=int(memory.total) // BYTES_PER_MIB,
                    power_w=self._power_w(handle),
                    gpu_index=gpu_index,
                    product_name=name,
                )
            )
        return samples

    def process_memory(self) -> list[ProcessMemory]:
        """Device memory of every compute process, per schedulable device (a MIG instance lists its own)."""
        held = []
        for device, handle in self._device_handles:
            try:
                processes = self._nvml.nvmlDeviceGetComputeRunningProcesses(handle)
            except self._nvml.NVMLError as exc:
                logger.warning("NVML cannot list processes on %s: %s", device.uuid, exc)
                continue
            for process in processes:
                used = getattr(process, "usedGpuMemory", None)
                if used is not None:  # None: the driver does not account it (e.g. Windows WDDM)
                    held.append(ProcessMemory(int(process.pid), device.uuid, int(used) // BYTES_PER_MIB))
        return held

    def process_utilization(self) -> list[ProcessUtilization]:
        """Each process's SM utilisation on each whole GPU, the mean of NVML's samples since the last call (a MIG
        instance has no per-process samples; a GPU with no new sample reports nothing)."""
        busy = []
        for device, handle in self._device_handles:
            if device.is_mig:
                continue
            try:
                samples = self._nvml.nvmlDeviceGetProcessUtilization(handle, self._last_sample_us.get(device.uuid, 0))
            except self._nvml.NVMLError:  # NOT_FOUND: no sample since then; NOT_SUPPORTED on some boards
                continue
            by_pid: dict[int, list[float]] = {}
            for sample in samples:
                by_pid.setdefault(int(sample.pid), []).append(float(sample.smUtil))
                newest = max(self._last_sample_us.get(device.uuid, 0), int(sample.timeStamp))
                self._last_sample_us[device.uuid] = newest
            busy += [ProcessUtilization(pid, device.uuid, sum(v) / len(v)) for pid, v in sorted(by_pid.items())]
        return busy

    def _add_gpu(self, handle: Any) -> None:
        nvml = self._nvml
        uuid, name = _text(nvml.nvmlDeviceGetUUID(handle)), _text(nvml.nvmlDeviceGetName(handle))
        mem_mib = int(nvml.nvmlDeviceGetMemoryInfo(handle).total) // BYTES_PER_MIB
        model = match_catalog_model(name, mem_mib)
        if not self._mig_enabled(handle):
            whole = GpuDevice(0, uuid, model, mem_mib, simulated=False, node=self._node, product_name=name)
            self._append(whole, handle)
            return
        mig_handles = self._mig_handles(handle)
        if not mig_handles:
            logger.warning("GPU %s has MIG enabled but no MIG instances: nothing on it can be scheduled", uuid)
        for mig in mig_handles:
            mig_mib = int(nvml.nvmlDeviceGetMemoryInfo(mig).total) // BYTES_PER_MIB
            mig_device = GpuDevice(
                0,
                _text(nvml.nvmlDeviceGetUUID(mig)),
                model,  # a MIG instance keeps its GPU's model; its memory is its own
                mig_mib,
                simulated=False,
                node=self._node,
                product_name=_text(nvml.nvmlDeviceGetName(mig)),
                mig_parent_uuid=uuid,
            )
            self._append(mig_device, mig)

    def _append(self, device: GpuDevice, handle: Any) -> None:
        self._device_handles.append((replace(device, index=len(self._device_handles)), handle))

    def _mig_enabled(self, handle: Any) -> bool:
        try:
            current, _pending = self._nvml.nvmlDeviceGetMigMode(handle)
        except self._nvml.NVMLError:  # not supported on this GPU (pre-Ampere, consumer boards)
            return False
        return int(current) == NVML_DEVICE_MIG_ENABLE

    def _mig_handles(self, handle: Any) -> list[Any]:
        try:
            slots = self._nvml.nvmlDeviceGetMaxMigDeviceCount(handle)
        except self._nvml.NVMLError as exc:
            logger.warning("NVML cannot count MIG instances: %s", exc)
            return []
        handles = []
        for slot in range(slots):
            try:
                handles.append(self._nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot))
            except self._nvml.NVMLError:  # an empty slot: NVML answers NOT_FOUND
                continue
        return handles

    def _util_pct(self, handle: Any) -> float:
        try:
            return float(self._nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
        except self._nvml.NVMLError:  # NOT_SUPPORTED on a MIG-enabled GPU
            return math.nan

    def _power_w(self, handle: Any) -> float:
        try:
            return self._nvml.nvmlDeviceGetPowerUsage(handle) / MILLIWATTS_PER_WATT
        except self._nvml.NVMLError:  # NOT_SUPPORTED on some boards
            return math.nan


def _text(value: str | bytes) -> str:
    """NVML strings: ``str`` from current ``pynvml``, ``bytes`` from old releases."""
    return value.decode() if isinstance(value, bytes) else value
