"""The scheduler loop's values: its configuration, its view of a running workload, a tick's decisions not yet
stored, the snapshot it publishes after each step (and how it is built), the workloads the memory watchdog watches,
and the texts of its events. Used by ``server.loop``.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tessera.backends.base import Handle
from tessera.core.cluster import ClusterState
from tessera.core.preemption import PreemptionGuard
from tessera.core.queueing.quotas import Admission, QueueSpec, QuotaLedger
from tessera.core.scheduler import Bind, Grow, PendingWorkload, Preempt, RunningWorkload, Shrink
from tessera.core.throughput import ColocationModel, ThroughputModel
from tessera.core.workload import MILLI_PER_GPU, Placement
from tessera.gpu.gpus import GpuDevice
from tessera.server.memory_watch import Watched
from tessera.server.pool import Pool
from tessera.server.store.changes import ReasonChange, StopReason
from tessera.server.store.models import WorkloadRow
from tessera.server.workload_limits import WorkloadLimits


@dataclass(frozen=True, slots=True)
class LoopConfig:
    run_dir: Path  # logs and per-workload process files
    policy: str = "tessera"  # the scheduling preset (core.presets): tessera, static, fifo-share, tiresias, gavel, ...
    knobs: tuple[str, ...] = ()  # the preset's knobs changed, KEY=VALUE (``core.preset_knobs``: tessera up --set)
    placement: str | None = None  # a core.placement policy instead of the preset's (e.g. tessera-online); None: its
    seed: int = 0  # the step's random generator (ties), so a replay makes the same decisions
    interval_s: float = 0.2  # time between steps
    stop_grace_s: float = 10.0  # SIGTERM -> SIGKILL
    requeue_preempted: bool = True  # a preempted workload waits again (False: it ends as "preempted")
    service_max_restarts: int = 3  # a service that exits is relaunched this many times, then fails
    preemption_min_runtime_s: float = 600.0  # a workload preempted once runs this long before priority preempts it
    mps: bool = False  # an MPS daemon serves the GPUs: launches get MPS compute and memory limits
    # Placement attempts per step: a step over many pending workloads stays short (the rest go 0.2 s later).
    max_tries_per_step: int = 1000
    # How long a step waits for the launches it decided (made by a worker thread, server.launch_worker) before it
    # goes on; launches still being made are recorded at a later step. Bounds a step whatever the backend does.
    launch_wait_s: float = 0.02
    limits: WorkloadLimits = WorkloadLimits()  # what every workload is held to besides its request
    # The throughput and co-location tables job types are read against (``tessera up --gavel DIR`` loads Gavel's
    # two CSV files, as ``tessera simulate timeline --traces DIR`` reads DIR/gavel); None: the embedded tables
    # (``core.throughput_defaults``), as the twin's default.
    job_models: tuple[ThroughputModel, ColocationModel] | None = None


@dataclass(slots=True)
class RunningEntry:
    row: WorkloadRow
    placements: tuple[Placement, ...]  # empty once preempted (its capacity went to the preemptor)
    admission: Admission | None
    started_s: float
    launched: bool  # False: decided and stored, launch not submitted yet; True: submitted (see server.launcher)
    waits_for: set[int] = field(default_factory=set)  # preempted victims that must exit before the launch
    stop_sent: StopReason | None = None  # why a stop was sent, once one was
    handle: Handle | None = None  # the backend's handle, once started or adopted


@dataclass(frozen=True, slots=True)
class Victim:
    """A running workload that a plan of the tick preempted, as it was before: its entry's placements, admission and
    stop, and its entry in the books (``Scheduler.restore`` puts it back), to undo the preemption when the tick's
    decisions cannot be stored."""

    placements: tuple[Placement, ...]
    admission: Admission | None
    stop: StopReason | None
    books: RunningWorkload


@dataclass(frozen=True, slots=True)
class TickResize:
    """A running workload that a plan of the tick shrank or grew, as it was before (its books entry, its entry's
    placements, admission and stop), to undo the resize when the tick's decisions cannot be stored."""

    decision: Shrink | Grow
    before: RunningWorkload
    placements: tuple[Placement, ...]
    admission: Admission | None
    stop: StopReason | None
    settled: tuple[float, float, float | None]  # the row's gpu_s_settled, cpu_s_settled and settled_at before
    text: str  # how many workers before and after, and why (its event)


@dataclass(slots=True)
class TickDecisions:
    """The decisions of one tick's plans, already in the scheduler's books, not yet stored."""

    preempts: list[Preempt] = field(default_factory=list)
    binds: list[tuple[Bind, set[int]]] = field(default_factory=list)  # with the victims each must wait for
    waiting: dict[str, str] = field(default_factory=dict)  # workload id -> why it still waits
    victims: dict[int, Victim] = field(default_factory=dict)  # each victim as it was before its preemption
    resizes: list[TickResize] = field(default_factory=list)  # shrinks and grows of running workloads, in order
    taken: list[PendingWorkload] = field(default_factory=list)  # the workloads bound, as offered, in order
    guard: PreemptionGuard | None = None  # the preemption guard before the tick's first plan, for the same undo

    def unbind(self, workload_id: int) -> None:
        """Take back a bind of this tick before it is stored (a later plan of the tick preempted it): it never
        starts; it is still pending in the store, and the next tick's intake offers it again."""
        self.binds = [(bind, waits) for bind, waits in self.binds if int(bind.workload_id) != workload_id]


@dataclass(frozen=True, slots=True)
class ClusterSnapshot:
    """A copy of the allocation after a step, for readers on other threads (API, metrics)."""

    gpu_free_milli: np.ndarray[Any, np.dtype[np.int64]]
    cpu_free_milli: np.ndarray[Any, np.dtype[np.int64]]
    mem_free_mib: np.ndarray[Any, np.dtype[np.int64]]
    gpu_workloads: dict[tuple[int, int], list[int]]  # (node, gpu) -> workloads on it
    queue_usage: dict[str, dict[str, tuple[int, int, int]]]  # queue -> quota entry -> (gpu_milli, cpu_milli, mem_mib)

    def allocated_milli(self, node: int, gpu: int) -> int:
        """How much of GPU ``gpu`` of node ``node`` is allocated, in thousandths."""
        return MILLI_PER_GPU - int(self.gpu_free_milli[node, gpu])


def reason_changes(waiting: dict[str, str], pending: Collection[int], stored: dict[int, str]) -> list[ReasonChange]:
    """The wait reasons to store from a tick's ``waiting`` (workload id -> why it waits): those of workloads still
    ``pending`` whose reason differs from the one ``stored`` last."""
    return [
        ReasonChange(int(wid), reason)
        for wid, reason in waiting.items()
        if int(wid) in pending and stored.get(int(wid)) != reason
    ]


def cluster_snapshot(
    state: ClusterState,
    running: dict[int, RunningEntry],
    ledger: QuotaLedger | None,
    queue_specs: tuple[QueueSpec, ...],
) -> ClusterSnapshot:
    """A copy of ``state``'s free amounts, the workloads on each GPU and each queue's usage (``ledger`` None: no
    quotas, no usage), which the loop publishes after a step."""
    on_gpu: dict[tuple[int, int], list[int]] = {}
    for wid, entry in running.items():
        for p in entry.placements:
            for g in p.gpu_indices:
                on_gpu.setdefault((p.node, g), []).append(wid)
    usage: dict[str, dict[str, tuple[int, int, int]]] = {}
    if ledger is not None:
        for spec in queue_specs:
            used = {f: ledger.usage(spec.name, f) for f in spec.nominal}
            usage[spec.name] = {f: (u.gpu_milli, u.cpu_milli, u.mem_mib) for f, u in used.items()}
    return ClusterSnapshot(
        state.gpu_free_milli.copy(),
        state.cpu_free_milli.copy(),
        state.mem_free_mib.copy(),
        on_gpu,
        usage,
    )


@dataclass(frozen=True, slots=True)
class StepReport:
    binds: int
    preempts: int
    ended: int
    pending: int
    duration_s: float
    cpu_s: float = 0.0  # CPU time the loop's thread spent in the step: far below duration_s, the host was busy


def started_text(handle: Handle) -> str:
    return f"started ({handle.backend} backend)" + (f"; {handle.note}" if handle.note else "")


def exit_text(code: int | None) -> str:
    if code is None:
        return "the process vanished (no exit code)"
    if code < 0:
        return f"killed by signal {-code}"
    return f"exit code {code}"


def describe(entry: RunningEntry, pool: Pool) -> str:
    parts: list[str] = []
    for p in entry.placements:
        node = pool.nodes[p.node]
        if not p.gpu_indices:
            parts.append(f"node {node.name} (no GPU)")
            continue
        share = "" if p.gpu_milli_each >= 1000 else f" at {p.gpu_milli_each / 10:g}%"
        gpus = ",".join(str(g) for g in p.gpu_indices)
        parts.append(f"node {node.name} GPU {gpus} ({node.gpu_model}){share}")
    waits = f"; starts when workloads {sorted(entry.waits_for)} have stopped" if entry.waits_for else ""
    return "placed on " + "; ".join(parts) + waits


def share_milli(entry: RunningEntry) -> int:
    """The share of each GPU the workload holds (all its workers hold the same)."""
    return max((p.gpu_milli_each for p in entry.placements), default=0)


def watched(
    running: dict[int, RunningEntry], devices: Callable[[RunningEntry], tuple[GpuDevice, ...]]
) -> list[Watched]:
    """The workloads the memory watchdog watches: started, not being stopped, still holding their GPUs."""
    return [
        Watched(str(wid), entry.handle, devices(entry), share_milli(entry), entry.row.gpu_mem_mib)
        for wid, entry in running.items()
        if entry.handle is not None and entry.stop_sent is None and entry.placements
    ]
