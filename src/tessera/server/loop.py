"""The scheduler loop: the core's scheduling step on a wall clock, with the store as the source of truth.

One ``step()``: collect the workloads that ended (``Backend.poll``), stop those whose cancel was requested, plan with
``core.scheduler.Scheduler`` over the pending workloads, **write every decision to the store in one transaction**
(typed changes, ``server.store.changes``), and only then act on it (stop victims, launch through
``server.launcher``). A restarted server calls ``recover()`` first (``server.recovery``): it rebinds the stored
placements, re-charges the quotas and re-adopts the workloads that outlived the crash. Why a stop was sent is a
typed ``StopReason`` (cancel, preempted, watchdog), which decides what the workload's end means.

A bind that needs preempted victims to go first is launched only once they have exited (``held``): two processes
never hold one GPU share at once. The simulator runs the same ``Scheduler``; only the clock and the backend differ.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from tessera.backends.base import Backend, ExitStatus
from tessera.core.cluster import ClusterState
from tessera.core.placement import make_policy
from tessera.core.placement.base import Placer, TieBreak
from tessera.core.preemption import PreemptionGuard, PreemptionPolicy
from tessera.core.queueing import QueueSpec
from tessera.core.scheduler import Bind, PendingWorkload, RunningWorkload, Scheduler, SchedulerConfig, StepPlan
from tessera.core.workload import WorkloadState
from tessera.gpu.gpus import ProcessMemoryProbe
from tessera.server.launcher import Launcher
from tessera.server.loop_values import (
    ClusterSnapshot,
    LoopConfig,
    RunningEntry,
    StepReport,
    describe,
    exit_text,
    share_milli,
)
from tessera.server.memory_watch import MemoryWatch, Watched
from tessera.server.pool import Pool
from tessera.server.records import admission_record, placement_record, queue_spec, request_of
from tessera.server.recovery import recover_running
from tessera.server.store.changes import (
    BindChange,
    EndChange,
    ReasonChange,
    RequeueChange,
    StopChange,
    StopKind,
    StopReason,
    WorkloadChange,
)
from tessera.server.store.models import WorkloadRow
from tessera.server.store.store import Event, Store

log = logging.getLogger(__name__)

PENDING = WorkloadState.PENDING.value
RUNNING = WorkloadState.RUNNING.value


class SchedulerLoop:
    def __init__(
        self,
        store: Store,
        backend: Backend,
        pool: Pool,
        config: LoopConfig,
        clock: Callable[[], float] = time.time,
        on_step: Callable[[StepReport], None] | None = None,
        on_start: Callable[[WorkloadRow, float], None] | None = None,
        memory_probe: ProcessMemoryProbe | None = None,
    ) -> None:
        """``memory_probe`` (real GPUs through NVML) turns on the memory watchdog (``server.memory_watch``)."""
        self.store = store
        self.backend = backend
        self.pool = pool
        self._config = config
        self.clock = clock
        self.on_step = on_step
        self.on_start = on_start  # (workload, seconds it waited): metrics
        self.state = ClusterState(pool.nodes)
        self.rng = np.random.default_rng(config.seed)
        self.guard = PreemptionGuard(config.preemption_min_runtime_s)
        self.placer = Placer(
            self.state, make_policy(config.placement_policy, (), self.state.model_names), TieBreak.FIRST
        )
        self.running: dict[int, RunningEntry] = {}
        self.launcher = Launcher(store, backend, pool, config, self._launch_failed)
        self.memory_watch = (
            MemoryWatch(memory_probe, self._stop_for_memory, backend.pids) if memory_probe is not None else None
        )
        self._pending: dict[int, PendingWorkload] = {}  # built once per workload; whole rows are read at bind
        self._reasons: dict[int, str] = {}
        self.queue_specs: tuple[QueueSpec, ...] = ()
        self.scheduler = Scheduler(self.placer)
        self.snapshot = self._snapshot()

    @property
    def config(self) -> LoopConfig:
        return self._config

    @config.setter
    def config(self, config: LoopConfig) -> None:
        """A new configuration applies to the next step, launches included."""
        self._config = config
        self.launcher.config = config

    # ----------------------------------------------------------------------------------------------- the step

    def step(self) -> StepReport:
        started = time.perf_counter()
        now = self.clock()
        self._refresh_queues()
        ended = self._collect_exits(now)
        self._send_cancels(now)
        if self.memory_watch is not None:
            self.memory_watch.check(now, self._watched())
        self.launcher.launch_ready(self.running, now)
        pending = self._pending_workloads()
        plan = self.scheduler.plan(pending, now, rng=self.rng, running=self._candidates(), guard=self.guard)
        self._apply(plan, now)
        self.snapshot = self._snapshot()
        report = StepReport(len(plan.binds), len(plan.preempts), ended, len(pending), time.perf_counter() - started)
        if self.on_step is not None:
            self.on_step(report)
        return report

    def _pending_workloads(self) -> list[PendingWorkload]:
        ids = set(self.store.ids_in(PENDING))
        for gone in self._pending.keys() - ids:
            del self._pending[gone]
            self._reasons.pop(gone, None)
        for r in self.store.pending_requests(sorted(ids - self._pending.keys())):
            self._pending[r.id] = PendingWorkload(str(r.id), request_of(r), r.submitted_at, r.priority, r.queue)
        return list(self._pending.values())

    def _candidates(self) -> list[RunningWorkload]:
        return [
            RunningWorkload(
                str(wid), r.row.queue, r.row.priority, r.placements, r.admission, r.started_s, r.row.preemptible
            )
            for wid, r in self.running.items()
            if r.placements and r.admission is not None and r.stop_sent is None
        ]

    def _apply(self, plan: StepPlan, now: float) -> None:
        changes: list[WorkloadChange] = []
        events: list[Event] = []
        victims: set[int] = set()
        for preempt in plan.preempts:
            wid = int(preempt.workload_id)
            entry = self.running[wid]
            self._release(entry)
            entry.stop_sent = StopReason.preempted(preempt.reason)
            victims.add(wid)
            changes.append(StopChange(wid, entry.stop_sent))
            events.append(Event(wid, "preempted", f"{preempt.reason} (for workload {preempt.preemptor})"))
        self.guard = self.guard.record(str(v) for v in victims)
        bound: list[RunningEntry] = []
        bind_changes: list[BindChange] = []
        rows = {row.id: row for row in self.store.workloads_by_id(int(b.workload_id) for b in plan.binds)}
        for bind in plan.binds:
            entry = self._bind(bind, rows[int(bind.workload_id)], now, victims)
            bound.append(entry)
            bind_changes.append(self._bind_change(entry, now))
            events.append(Event(entry.row.id, "bound", describe(entry, self.pool)))
        reasons: list[ReasonChange] = []
        for wid_text, reason in plan.waiting.items():
            wid = int(wid_text)
            if self._reasons.get(wid) != reason:
                self._reasons[wid] = reason
                reasons.append(ReasonChange(wid, reason))
        # Decisions are durable before anything acts on them; a bind that lost the race with a cancel is undone.
        lost = self.store.commit_decisions(bind_changes, reasons, changes, events, now)
        for entry in [e for e in bound if e.row.id in lost]:
            self._release(entry)
            del self.running[entry.row.id]
            bound.remove(entry)
        for wid in victims:
            self.backend.stop(str(wid), self.config.stop_grace_s)
        if self.on_start is not None:
            for entry in bound:
                self.on_start(entry.row, now - entry.row.submitted_at)
        self.launcher.launch_all([entry for entry in bound if not entry.waits_for], now)

    def _bind(self, bind: Bind, row: WorkloadRow, now: float, victims: set[int]) -> RunningEntry:
        wid = int(bind.workload_id)
        del self._pending[wid]
        self._reasons.pop(wid, None)
        for placement in bind.placements:
            self.state.bind(placement)
        admission = self.scheduler.charge(bind)
        waits = {v for v in victims if v in self.running}
        entry = RunningEntry(row, bind.placements, admission, now, launched=False, waits_for=waits)
        self.running[wid] = entry
        return entry

    def _bind_change(self, entry: RunningEntry, now: float) -> BindChange:
        row = entry.row
        row.attempts += 1
        placement = [placement_record(p, self.pool) for p in entry.placements]
        return BindChange(row.id, placement, admission_record(entry.admission), now, row.attempts)

    # -------------------------------------------------------------------------------------------- processes

    def log_path(self, workload_id: int) -> Path:
        return self.launcher.log_path(workload_id)

    def _watched(self) -> list[Watched]:
        return [
            Watched(str(wid), entry.handle, self.launcher.devices(entry), share_milli(entry), entry.row.gpu_mem_mib)
            for wid, entry in self.running.items()
            if entry.handle is not None and entry.stop_sent is None and entry.placements
        ]

    def _stop_for_memory(self, workload_id: str, reason: str) -> None:
        entry = self.running[int(workload_id)]
        entry.stop_sent = StopReason.watchdog(reason)
        self.store.update_workloads(
            [StopChange(entry.row.id, entry.stop_sent)],
            [Event(entry.row.id, StopKind.WATCHDOG.value, reason)],
            self.clock(),
        )
        self.backend.stop(workload_id, self.config.stop_grace_s)

    def _send_cancels(self, now: float) -> None:
        wanted = self.store.cancel_requested_ids()
        for wid in wanted:
            entry = self.running.get(wid)
            if entry is None or entry.stop_sent == StopReason.cancel():
                continue
            if not entry.launched:
                self._finish(entry, WorkloadState.CANCELLED, None, "cancelled before it started", now)
                continue
            entry.stop_sent = StopReason.cancel()
            self.store.update_workloads([StopChange(wid, entry.stop_sent)], [], now)
            self.backend.stop(str(wid), self.config.stop_grace_s)

    def _collect_exits(self, now: float) -> int:
        statuses = self.backend.poll()
        for status in statuses:
            entry = self.running.get(int(status.workload_id))
            if entry is None:
                log.warning("backend reported the end of unknown workload %s", status.workload_id)
                continue
            self._on_exit(entry, status, now)
        return len(statuses)

    def _on_exit(self, entry: RunningEntry, status: ExitStatus, now: float) -> None:
        code = status.exit_code
        row = entry.row
        stop = entry.stop_sent
        if stop is not None and stop.kind is StopKind.CANCEL:
            self._finish(entry, WorkloadState.CANCELLED, code, "cancelled", now)
        elif stop is not None and stop.kind is StopKind.WATCHDOG:
            self._finish(entry, WorkloadState.FAILED, code, stop.text(), now)
        elif stop is not None:  # preempted
            if self.config.requeue_preempted:
                self.requeue(entry, f"{stop.text()}; requeued", now)
            else:
                self._finish(entry, WorkloadState.PREEMPTED, code, stop.text(), now)
        elif row.kind == "service" and row.attempts <= self.config.service_max_restarts:
            self.requeue(entry, f"service exited ({exit_text(code)}); restarting", now)
        elif code == 0:
            self._finish(entry, WorkloadState.SUCCEEDED, code, "exit code 0", now)
        else:
            self._finish(entry, WorkloadState.FAILED, code, exit_text(code), now)

    def _finish(self, entry: RunningEntry, state: WorkloadState, code: int | None, reason: str, now: float) -> None:
        wid = entry.row.id
        self._release(entry)
        self.running.pop(wid, None)
        self.guard = self.guard.forget([str(wid)])
        change = EndChange(wid, state, code, now, reason)
        self.store.update_workloads([change], [Event(wid, state.value, reason)], now)

    def _launch_failed(self, entry: RunningEntry, reason: str, now: float) -> None:
        self._finish(entry, WorkloadState.FAILED, None, reason, now)

    def requeue(self, entry: RunningEntry, reason: str, now: float) -> None:
        """``entry`` waits again: its capacity and quota are given back."""
        wid = entry.row.id
        self._release(entry)
        self.running.pop(wid, None)
        self.store.update_workloads([RequeueChange(wid, reason)], [Event(wid, "requeued", reason)], now)

    def _release(self, entry: RunningEntry) -> None:
        for placement in entry.placements:
            self.state.release(placement)
        self.scheduler.release(entry.admission)
        entry.placements, entry.admission = (), None

    def _snapshot(self) -> ClusterSnapshot:
        on_gpu: dict[tuple[int, int], list[int]] = {}
        for wid, entry in self.running.items():
            for p in entry.placements:
                for g in p.gpu_indices:
                    on_gpu.setdefault((p.node, g), []).append(wid)
        usage: dict[str, dict[str, tuple[int, int, int]]] = {}
        ledger = self.scheduler.ledger
        if ledger is not None:
            for spec in self.queue_specs:
                used = {f: ledger.usage(spec.name, f) for f in spec.nominal}
                usage[spec.name] = {f: (u.gpu_milli, u.cpu_milli, u.mem_mib) for f, u in used.items()}
        return ClusterSnapshot(
            self.state.gpu_free_milli.copy(),
            self.state.cpu_free_milli.copy(),
            self.state.mem_free_mib.copy(),
            on_gpu,
            usage,
        )

    # ------------------------------------------------------------------------------------------------ queues

    def _refresh_queues(self) -> None:
        specs = tuple(queue_spec(row) for row in self.store.queues())
        if specs == self.queue_specs:
            return
        self.queue_specs = specs
        config = SchedulerConfig(
            max_attempts_per_step=self.config.max_tries_per_step,
            queues=specs,
            preemption=PreemptionPolicy() if specs else None,
        )
        self.scheduler = Scheduler(self.placer, config)
        for entry in self.running.values():
            self.recharge(entry)

    def recharge(self, entry: RunningEntry) -> None:
        """Charge ``entry``'s admission to the current scheduler's quota ledger (after a restart or a queue change)."""
        admission = entry.admission
        if admission is None or self.scheduler.ledger is None:
            return
        try:
            entry.admission = self.scheduler.ledger.admit(admission.queue, admission.flavor_key, admission.charged)
        except Exception as exc:  # a quota was cut below what already runs: keep it running, uncharged
            log.warning("workload %s no longer fits its queue's quota: %s", entry.row.id, exc)
            entry.admission = None

    # ---------------------------------------------------------------------------------------------- recovery

    def recover(self) -> int:
        """Rebuild the in-memory view from the store after a (re)start (``server.recovery``); returns how many
        workloads were running."""
        self._refresh_queues()
        now = self.clock()
        rows = self.store.workloads_in([RUNNING])
        recover_running(rows, self, self.backend, self.pool, self.config.stop_grace_s, now)
        self.snapshot = self._snapshot()
        return len(rows)

    # ------------------------------------------------------------------------------------------------ running

    def run_forever(self, stop: Callable[[], bool]) -> None:
        """Step every ``interval_s`` until ``stop()`` says so; a failing step is logged and retried."""
        while not stop():
            try:
                self.step()
            except Exception:
                log.exception("scheduling step failed; retrying")
            time.sleep(self.config.interval_s)
