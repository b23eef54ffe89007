"""Prometheus metrics at ``/metrics``: workloads by state and queue, time spent pending, scheduling step latency and
the longest step, per-GPU allocated share and memory, per-queue usage against quota; per workload and GPU, the
allocated share and memory and (with NVML) each process's use, and the lifecycle counters
(``server.metrics_workloads``); with NVML, GPU usage under dcgm-exporter's names. docs/monitoring.md lists them.

Counts and allocations are read at scrape time from the store and the loop's snapshot (``MetricsCollector``);
latencies are observed as they happen (``ServerMetrics.observe_*``). One registry per server, never the global one.

Queues are named after tenants, so the series labelled by queue (or by workload or tenant) are private: ``registry``
has them all (served to an admin token), ``public`` leaves them out (served without a token).
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from tessera.backends.base import Handle
from tessera.core.workload import MILLI_PER_GPU
from tessera.gpu.gpus import ProcessUsageProbe
from tessera.server.metrics_workloads import (
    BYTES_PER_MIB,
    LifecycleCounters,
    WorkloadGpuCollector,
    device_labels,
)
from tessera.server.records import NO_LIMIT
from tessera.server.store import served
from tessera.server.store.store import Store
from tessera.serving.replica_health import ModelHealth

if TYPE_CHECKING:
    from tessera.server.loop import SchedulerLoop

_PENDING_BUCKETS = (0.1, 0.5, 1, 5, 15, 60, 300, 900, 3600, 4 * 3600, 24 * 3600)
_STEP_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)
PRIVATE_LABELS = frozenset({"queue", "served_model", "workload", "workload_name", "tenant"})


class ServerMetrics:
    def __init__(
        self,
        store: Store,
        loop: SchedulerLoop,
        clock: Callable[[], float] | None = None,
        usage: ProcessUsageProbe | None = None,
        pids: Callable[[Handle], list[int]] | None = None,
        model_health: Mapping[int, ModelHealth] | None = None,
    ) -> None:
        """``clock``: the server's (the lifecycle counters settle events by their time; default the loop's);
        ``usage`` and ``pids`` (real GPUs through NVML): each workload process's GPU use."""
        self.registry = CollectorRegistry(auto_describe=True)
        self._step_max_s = 0.0
        self.pending_seconds = Histogram(
            "tessera_workload_pending_seconds",
            "Time from submission to placement",
            ["queue"],
            buckets=_PENDING_BUCKETS,
            registry=self.registry,
        )
        self.step_seconds = Histogram(
            "tessera_scheduling_step_seconds",
            "Duration of one scheduling step",
            buckets=_STEP_BUCKETS,
            registry=self.registry,
        )
        # The histogram's top bucket says only "over 5 s"; how long the worst step took is what a stall shows.
        self.step_max_seconds = Gauge(
            "tessera_scheduling_step_max_seconds",
            "Duration of the longest scheduling step since the server started",
            registry=self.registry,
        )
        # The CPU time of the longest step: a long step that used little CPU waited for the host, not for its work.
        self.step_max_cpu_seconds = Gauge(
            "tessera_scheduling_step_max_cpu_seconds",
            "CPU time the loop's thread spent in the longest scheduling step",
            registry=self.registry,
        )
        self.replica_starts = Counter(
            "tessera_model_replica_starts",
            "Replicas the serving controller started (each loads its model: a cold start)",
            ["served_model"],
            registry=self.registry,
        )
        self.replica_failures = Counter(
            "tessera_model_replica_failures",
            "Replicas that ended on their own (crashed, or their engine could not start)",
            ["served_model"],
            registry=self.registry,
        )
        self.model_failing = Gauge(
            "tessera_model_failing",
            "1 while the model's replicas keep failing and none is ready (the gateway answers 503), else 0",
            ["served_model"],
            registry=self.registry,
        )
        self.states = _StateCollector(store, loop, model_health if model_health is not None else {})
        self.registry.register(self.states)
        self.registry.register(WorkloadGpuCollector(loop, usage, pids))
        self.registry.register(LifecycleCounters(store, clock or loop.clock))
        self.public = CollectorRegistry(auto_describe=False)
        self.public.register(_WithoutLabels(self.registry, PRIVATE_LABELS))

    def observe_step(self, seconds: float, cpu_seconds: float = 0.0) -> None:
        """One scheduling step took ``seconds``, ``cpu_seconds`` of them on a CPU (the loop thread calls this)."""
        self.step_seconds.observe(seconds)
        if seconds > self._step_max_s:
            self._step_max_s = seconds
            self.step_max_seconds.set(seconds)
            self.step_max_cpu_seconds.set(cpu_seconds)

    def register(self, collector: Collector) -> None:
        self.registry.register(collector)


class _WithoutLabels(Collector):
    """The families of ``source`` none of whose series carries one of ``labels``."""

    def __init__(self, source: CollectorRegistry, labels: frozenset[str]) -> None:
        self.source = source
        self.labels = labels

    def collect(self) -> Iterator[Metric]:
        for family in self.source.collect():
            if not any(self.labels & sample.labels.keys() for sample in family.samples):
                yield family


class _StateCollector(Collector):
    def __init__(self, store: Store, loop: SchedulerLoop, model_health: Mapping[int, ModelHealth]) -> None:
        self.store = store
        self.loop = loop
        self.model_health = model_health  # the serving controller's view (``ServerContext.model_health``)
        self.replica_ready: Callable[[int, int], bool] | None = None  # as ``ServerContext.replica_ready``

    def collect(self) -> Iterator[Metric]:
        yield self._workloads()
        yield from self._gpus()
        yield from self._queues()
        yield from self._models()

    def _models(self) -> Iterator[Metric]:
        """Per served model: replicas running now (serving or starting), those of them the gateway serves (ready) and
        the controller's target; its lifecycle state (1 for the state it is in, 0 for the others); and how often its
        replicas were evicted."""
        family = GaugeMetricFamily(
            "tessera_model_replicas", "Replicas of a served model: running, ready, desired",
            labels=["served_model", "kind"],
        )  # fmt: skip
        state = GaugeMetricFamily(
            "tessera_model_state", "1 for the lifecycle state a served model is in", labels=["served_model", "state"]
        )
        evicted = CounterMetricFamily(
            "tessera_model_evictions",
            "Replicas of a served model preempted for a higher-priority workload (it gave up its GPU share)",
            labels=["served_model"],
        )
        models = served.models(self.store)
        replicas = served.active_replicas(self.store, [m.id for m in models])
        evictions = served.evictions(self.store, [m.id for m in models])
        for m in models:
            running = sum(r.state == "running" and not r.cancel_requested for r in replicas[m.id])
            family.add_metric([m.name, "running"], running)
            family.add_metric([m.name, "ready"], served.ready_replicas(replicas[m.id], self.replica_ready))
            family.add_metric([m.name, "desired"], m.desired_replicas)
            now = served.model_state(m, replicas[m.id], self.model_health.get(m.id), self.replica_ready)
            for name in served.MODEL_STATES:
                state.add_metric([m.name, name], float(name == now))
            evicted.add_metric([m.name], evictions.get(m.id, 0))
        yield family
        yield state
        yield evicted

    def _workloads(self) -> Metric:
        family = GaugeMetricFamily("tessera_workloads", "Workloads by state and queue", labels=["state", "queue"])
        for state, queue, count in self.store.count_by_state_and_queue():
            family.add_metric([state, queue], count)
        return family

    def _gpus(self) -> Iterator[Metric]:
        """Per GPU: Tessera's labels (node, gpu, uuid, model) and dcgm-exporter's (``metrics_workloads``)."""
        labels = ["node", "gpu", "uuid", "model", "Hostname", "UUID", "modelName", "simulated"]
        share = GaugeMetricFamily("tessera_gpu_allocated_ratio", "Share of the GPU allocated (0..1)", labels=labels)
        memory = GaugeMetricFamily(
            "tessera_gpu_allocated_memory_bytes", "Device memory allocated (the allocated share of it)", labels=labels
        )
        snapshot = self.loop.snapshot
        pool = self.loop.pool
        hostname = socket.gethostname()
        for n, node in enumerate(pool.nodes[: len(snapshot.cpu_free_milli)]):  # a node that just joined: next time
            for g, device in enumerate(pool.devices[n]):
                used_milli = snapshot.allocated_milli(n, g)
                _, host, _, uuid, model_name, simulated = device_labels(device, node.name, hostname)
                values = [node.name, str(g), device.uuid, device.model, host, uuid, model_name, simulated]
                share.add_metric(values, used_milli / MILLI_PER_GPU)
                memory.add_metric(values, used_milli * device.mem_mib * BYTES_PER_MIB // MILLI_PER_GPU)
        yield share
        yield memory

    def _queues(self) -> Iterator[Metric]:
        labels = ["queue", "flavor", "resource"]
        usage = GaugeMetricFamily("tessera_queue_usage", "What a queue's running workloads hold", labels=labels)
        quota = GaugeMetricFamily(
            "tessera_queue_nominal_quota", "A queue's nominal quota (absent: no limit)", labels=labels
        )
        specs = {s.name: s for s in self.loop.queue_specs}
        for queue, entries in self.loop.snapshot.queue_usage.items():
            for flavor, used in entries.items():
                nominal = specs[queue].nominal[flavor] if queue in specs else None
                for resource, value, cap in zip(
                    ("gpu_milli", "cpu_milli", "mem_mib"),
                    used,
                    (nominal.gpu_milli, nominal.cpu_milli, nominal.mem_mib) if nominal else (None,) * 3,
                    strict=True,
                ):
                    usage.add_metric([queue, flavor, resource], value)
                    if cap is not None and cap < NO_LIMIT:
                        quota.add_metric([queue, flavor, resource], cap)
        yield usage
        yield quota
