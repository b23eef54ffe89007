"""The per-workload part of ``/metrics``: what each running workload holds on each GPU, what its processes use there
(with NVML), and the lifecycle counters (submissions, starts, preemptions, failures).

The GPU series carry dcgm-exporter's label names for the device (``UUID``, ``gpu``, ``Hostname``, ``modelName``),
so a PromQL join such as ``... * on(UUID) group_left DCGM_FI_DEV_GPU_UTIL`` puts a workload next to its GPU's
readings. ``UUID`` is the physical GPU's (a MIG instance reports its parent's, as dcgm-exporter does); ``gpu`` is the
device's index on its node, which is DCGM's NVML index when the node has no MIG instance. Values are in base
units: a ratio (1 = the whole GPU) and bytes.

Every series is built at scrape time from the loop's running workloads, so a workload's series go with it when it
ends: the number of series stays bounded by what runs now. They are labelled by workload, queue and tenant, so
they are private (``metrics.PRIVATE_LABELS``): only an admin token reads them.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from tessera.backends.base import Handle
from tessera.core.workload import MILLI_PER_GPU
from tessera.gpu.gpus import GpuDevice, ProcessUsageProbe
from tessera.gpu.isolation import memory_allowance_mib
from tessera.server.store.counts import event_counts, settled_event_id
from tessera.server.store.store import Store

if TYPE_CHECKING:
    from tessera.server.loop import SchedulerLoop
    from tessera.server.loop_values import RunningEntry

BYTES_PER_MIB = 1024 * 1024
WORKLOAD_LABELS = ("workload", "workload_name", "queue", "tenant")
DEVICE_LABELS = ("node", "Hostname", "gpu", "UUID", "modelName", "simulated")
# Event kind -> counter (the kinds as the store writes them: store.add_workload, launcher, loop_ends, loop._finish).
COUNTED_EVENTS: Mapping[str, tuple[str, str]] = {
    "submitted": ("tessera_workload_submissions", "Workloads submitted"),
    "started": ("tessera_workload_starts", "Workload processes started (a requeued workload starts again)"),
    "preempted": ("tessera_workload_preemptions", "Workloads preempted to make room for others"),
    "failed": ("tessera_workload_failures", "Workloads that ended failed (exit code, launch error or watchdog)"),
}
SETTLE_S = 30.0  # events older than this are counted once and for all (no transaction stays open that long)


def device_labels(device: GpuDevice, node: str, hostname: str) -> list[str]:
    """dcgm-exporter's labels of ``device`` (see the module docstring), after Tessera's own node name."""
    host = hostname if device.node == "local" else device.node
    uuid = device.mig_parent_uuid or device.uuid
    model = device.product_name or device.model
    return [node, host, str(device.index), uuid, model, str(device.simulated).lower()]


@dataclass(frozen=True, slots=True)
class _Held:
    """One workload on one GPU: its labels and share."""

    labels: list[str]
    device: GpuDevice
    gpu_milli: int
    gpu_mem_mib: int


class WorkloadGpuCollector(Collector):
    """Per workload and GPU: the allocated share and memory; with ``usage`` (real GPUs read through NVML) and
    ``pids`` (the backend's ``pids``), each of its processes' used memory and SM utilisation."""

    def __init__(
        self,
        loop: SchedulerLoop,
        usage: ProcessUsageProbe | None = None,
        pids: Callable[[Handle], list[int]] | None = None,
        hostname: str | None = None,
    ) -> None:
        self.loop = loop
        self.usage = usage
        self.pids = pids
        self.hostname = hostname if hostname is not None else socket.gethostname()

    def collect(self) -> Iterator[Metric]:
        running = dict(self.loop.running)  # a copy: the loop's thread changes it between (and during) scrapes
        labels = [*WORKLOAD_LABELS, *DEVICE_LABELS]
        share = GaugeMetricFamily(
            "tessera_workload_gpu_allocated_ratio",
            "Share of the GPU allocated to the workload (1 = whole)",
            labels=labels,
        )
        memory = GaugeMetricFamily(
            "tessera_workload_gpu_allocated_memory_bytes",
            "Device memory the workload may hold on the GPU (its --gpu-mem, else its share of the GPU's memory)",
            labels=labels,
        )
        held = {wid: self._held(entry) for wid, entry in sorted(running.items())}
        for on_gpus in held.values():
            for h in on_gpus:
                share.add_metric(h.labels, h.gpu_milli / MILLI_PER_GPU)
                allowance = memory_allowance_mib((h.device,), h.gpu_milli, h.gpu_mem_mib)
                memory.add_metric(h.labels, allowance * BYTES_PER_MIB)
        yield share
        yield memory
        if self.usage is not None and self.pids is not None:
            yield from self._processes(running, held)

    def _held(self, entry: RunningEntry) -> list[_Held]:
        row, pool = entry.row, self.loop.pool
        own = [str(row.id), row.name, row.queue, row.tenant]
        out = []
        for p in entry.placements:  # empty once preempted: its capacity already went to the preemptor
            for g in p.gpu_indices:
                device = pool.device(p.node, g)
                labels = own + device_labels(device, pool.nodes[p.node].name, self.hostname)
                out.append(_Held(labels, device, p.gpu_milli_each, row.gpu_mem_mib))
        return out

    def _processes(self, running: dict[int, RunningEntry], held: dict[int, list[_Held]]) -> Iterator[Metric]:
        assert self.usage is not None and self.pids is not None
        labels = [*WORKLOAD_LABELS, *DEVICE_LABELS, "pid"]
        used = GaugeMetricFamily(
            "tessera_workload_process_gpu_memory_used_bytes",
            "Device memory a process of the workload holds on the GPU (NVML)",
            labels=labels,
        )
        busy = GaugeMetricFamily(
            "tessera_workload_process_gpu_utilization_ratio",
            "Share of the time a process of the workload kept the GPU's SMs busy since the last scrape (NVML, 0..1)",
            labels=labels,
        )
        owner: dict[int, int] = {}
        for wid, entry in running.items():
            if entry.handle is not None and held.get(wid):
                owner.update((pid, wid) for pid in self.pids(entry.handle))
        if not owner:
            return
        where = {(wid, h.device.uuid): h.labels for wid, on_gpus in held.items() for h in on_gpus}
        for sample in self.usage.process_memory():
            wid = owner.get(sample.pid, -1)
            if (found := where.get((wid, sample.gpu_uuid))) is not None:
                used.add_metric([*found, str(sample.pid)], sample.used_mib * BYTES_PER_MIB)
        for util in self.usage.process_utilization():
            wid = owner.get(util.pid, -1)
            if (found := where.get((wid, util.gpu_uuid))) is not None:
                busy.add_metric([*found, str(util.pid)], util.sm_pct / 100.0)
        yield used
        yield busy


class LifecycleCounters(Collector):
    """``*_total`` counters per queue, read from the store's event log (``store.counts``): they count everything
    the store has seen, across restarts. Scrapes may come from several threads at once: one reads at a time."""

    def __init__(self, store: Store, clock: Callable[[], float]) -> None:
        self.store = store
        self.clock = clock
        self._lock = threading.Lock()
        self._settled_id = 0
        self._settled: dict[tuple[str, str], int] = {}

    def describe(self) -> list[Metric]:
        """The names without a query (the registry asks for them when the collector is registered)."""
        return [CounterMetricFamily(name, doc, labels=["queue"]) for name, doc in COUNTED_EVENTS.values()]

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            newest = settled_event_id(self.store, self._settled_id, self.clock() - SETTLE_S)
            if newest > self._settled_id:
                for key, n in event_counts(self.store, COUNTED_EVENTS, self._settled_id, newest).items():
                    self._settled[key] = self._settled.get(key, 0) + n
                self._settled_id = newest
            counts = dict(self._settled)
            for key, n in event_counts(self.store, COUNTED_EVENTS, self._settled_id).items():
                counts[key] = counts.get(key, 0) + n
        families = {
            kind: CounterMetricFamily(name, doc, labels=["queue"]) for kind, (name, doc) in COUNTED_EVENTS.items()
        }
        for (kind, queue), n in sorted(counts.items()):
            families[kind].add_metric([queue], n)
        yield from families.values()
