"""GPU usage as Prometheus metrics under dcgm-exporter's names, so existing DCGM dashboards and alerts work.

``GpuUsageCollector`` is a ``prometheus_client`` custom collector: the server (or node agent) registers it on
the registry it serves at ``/metrics``; each scrape takes a fresh ``GpuProbe.usage()`` sample. Metrics mirror
dcgm-exporter's: ``DCGM_FI_DEV_GPU_UTIL`` (%), ``DCGM_FI_DEV_FB_USED`` and ``DCGM_FI_DEV_FB_FREE`` (MiB),
``DCGM_FI_DEV_POWER_USAGE`` (W), labelled ``gpu`` (NVML index), ``UUID``, ``device`` (``nvidia<index>``),
``modelName`` (the driver's product name) and ``Hostname``. A simulated pool exports nothing: it has no usage.
"""

from __future__ import annotations

import logging
import math
import socket
from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily, Metric

from tessera.gpu.gpus import SIMULATED_UUID_PREFIX, GpuDevice, GpuProbe, GpuUsage

logger = logging.getLogger(__name__)

LABELS = ("gpu", "UUID", "device", "modelName", "Hostname")
_METRICS = (  # (name, help), in the order of _values
    ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %)."),
    ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB)."),
    ("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB)."),
    ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W)."),
)


def _values(usage: GpuUsage) -> tuple[float, float, float, float]:
    """One sample's value for each of ``_METRICS``; NaN where the driver could not say."""
    free_mib = usage.mem_total_mib - usage.mem_used_mib
    return usage.util_pct, float(usage.mem_used_mib), float(free_mib), usage.power_w


class GpuUsageCollector:
    """Exports ``probe``'s usage on every scrape; ``hostname`` defaults to this host's name."""

    def __init__(self, probe: GpuProbe, hostname: str | None = None) -> None:
        self._probe = probe
        self._hostname = hostname if hostname is not None else socket.gethostname()
        self._devices: dict[str, GpuDevice] = {d.uuid: d for d in probe.devices()}

    def describe(self) -> list[Metric]:
        """The metric names, without sampling (lets a registry check for clashes without touching NVML)."""
        return [GaugeMetricFamily(name, doc, labels=LABELS) for name, doc in _METRICS]

    def collect(self) -> Iterator[Metric]:
        try:
            samples = [u for u in self._probe.usage() if not self._is_simulated(u)]
        except Exception:  # a failing probe must not fail the whole scrape
            logger.warning("GPU usage sampling failed; exporting no GPU metrics this scrape", exc_info=True)
            return
        if not samples:
            return
        families = [GaugeMetricFamily(name, doc, labels=LABELS) for name, doc in _METRICS]
        for position, usage in enumerate(samples):
            labels = self._labels(usage, position)
            for family, value in zip(families, _values(usage), strict=True):
                if not math.isnan(value):  # the driver could not say: leave the series out, as dcgm-exporter does
                    family.add_metric(labels, value)
        yield from families

    def _labels(self, usage: GpuUsage, position: int) -> list[str]:
        device = self._devices.get(usage.uuid)
        index = usage.gpu_index if usage.gpu_index >= 0 else (device.index if device else position)
        model = usage.product_name or (device.product_name or device.model if device else "")
        return [str(index), usage.uuid, f"nvidia{index}", model, self._hostname]

    def _is_simulated(self, usage: GpuUsage) -> bool:
        device = self._devices.get(usage.uuid)
        return usage.uuid.startswith(SIMULATED_UUID_PREFIX) or (device is not None and device.simulated)
