"""The scheduler loop: the core's scheduling step on a wall clock, with the store as the source of truth.

One ``step()``: collect the workloads that ended (``Backend.poll``), stop those whose cancel was requested, plan with
``core.scheduler.Scheduler`` over the pending workloads, **write every decision to the store in one transaction**,
and only then act on it (stop victims, launch processes). A restarted server calls ``recover()`` first: it rebinds
the stored placements, re-charges the quotas and re-adopts the processes that outlived the crash.

A bind that needs preempted victims to go first is launched only once they have exited (``held``): two processes
never hold one GPU share at once. The simulator runs the same ``Scheduler``; only the clock and the backend differ.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from tessera.agent.gpus import GpuDevice, ProcessMemoryProbe
from tessera.agent.isolation import isolation_env
from tessera.backends.base import Backend, ExitStatus, Handle, LaunchSpec
from tessera.core.cluster import ClusterState
from tessera.core.placement import make_policy
from tessera.core.placement.base import Placer, TieBreak
from tessera.core.preemption import PreemptionGuard, PreemptionPolicy
from tessera.core.queueing import QueueSpec
from tessera.core.scheduler import Bind, PendingWorkload, RunningWorkload, Scheduler, SchedulerConfig, StepPlan
from tessera.core.workload import WorkloadState
from tessera.errors import InvalidRequestError, TesseraError
from tessera.server.loop_values import (
    ClusterSnapshot,
    LoopConfig,
    RunningEntry,
    StepReport,
    describe,
    exit_text,
    started_text,
)
from tessera.server.memory_watch import MemoryWatch, Watched
from tessera.server.pool import Pool
from tessera.server.records import (
    admission_of,
    admission_record,
    handle_of,
    placement_of,
    placement_record,
    queue_spec,
    request_of,
)
from tessera.server.store.models import WorkloadRow
from tessera.server.store.store import Event, Store

log = logging.getLogger(__name__)

PENDING = WorkloadState.PENDING.value
RUNNING = WorkloadState.RUNNING.value
WATCHDOG = "watchdog"  # stop_reason prefix of a workload the memory watchdog stopped


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
        self.config = config
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
        self.memory_watch = (
            MemoryWatch(memory_probe, self._stop_for_memory, backend.pids) if memory_probe is not None else None
        )
        self._logs_dir = config.run_dir / "logs"
        self._logs_made = False
        self._pending: dict[int, PendingWorkload] = {}  # built once per workload; whole rows are read at bind
        self._reasons: dict[int, str] = {}
        self.queue_specs: tuple[QueueSpec, ...] = ()
        self.scheduler = Scheduler(self.placer)
        self.snapshot = self._snapshot()

    # ----------------------------------------------------------------------------------------------- the step

    def step(self) -> StepReport:
        started = time.perf_counter()
        now = self.clock()
        self._refresh_queues()
        ended = self._collect_exits(now)
        self._send_cancels(now)
        if self.memory_watch is not None:
            self.memory_watch.check(now, self._watched())
        self._launch_ready(now)
        pending = self._pending_workloads()
        plan = self.scheduler.plan(pending, self.rng, self._candidates(), now, self.guard)
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
        changes: list[dict[str, Any]] = []
        events: list[Event] = []
        victims: set[int] = set()
        for preempt in plan.preempts:
            wid = int(preempt.workload_id)
            entry = self.running[wid]
            self._release(entry)
            entry.stop_sent = f"preempted: {preempt.reason}"
            victims.add(wid)
            changes.append({"id": wid, "stop_reason": entry.stop_sent})
            events.append(Event(wid, "preempted", f"{preempt.reason} (for workload {preempt.preemptor})"))
        self.guard = self.guard.record(str(v) for v in victims)
        bound: list[RunningEntry] = []
        bind_changes: list[dict[str, Any]] = []
        rows = {row.id: row for row in self.store.workloads_by_id(int(b.workload_id) for b in plan.binds)}
        for bind in plan.binds:
            entry = self._bind(bind, rows[int(bind.workload_id)], now, victims)
            bound.append(entry)
            bind_changes.append(self._bind_change(entry, now))
            events.append(Event(entry.row.id, "bound", describe(entry, self.pool)))
        reasons: list[dict[str, Any]] = []
        for wid_text, reason in plan.waiting.items():
            wid = int(wid_text)
            if self._reasons.get(wid) != reason:
                self._reasons[wid] = reason
                reasons.append({"id": wid, "reason": reason})
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
        self._launch_all([entry for entry in bound if not entry.waits_for], now)

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

    def _bind_change(self, entry: RunningEntry, now: float) -> dict[str, Any]:
        row = entry.row
        row.attempts += 1
        return {
            "id": row.id,
            "state": RUNNING,
            "placement": [placement_record(p, self.pool) for p in entry.placements],
            "admission": admission_record(entry.admission),
            "started_at": now,
            "attempts": row.attempts,
            "reason": "",
            "stop_reason": None,
            "handle": None,
        }

    # -------------------------------------------------------------------------------------------- processes

    def _launch_ready(self, now: float) -> None:
        ready: list[RunningEntry] = []
        for entry in list(self.running.values()):
            if not entry.launched and entry.stop_sent is None:
                entry.waits_for &= set(self.running)
                if not entry.waits_for:
                    ready.append(entry)
        self._launch_all(ready, now)

    def _launch_all(self, entries: list[RunningEntry], now: float) -> None:
        """Launch ``entries`` and store their handles in one transaction (one per launch made a step over
        thousands of binds take seconds). A handle that a crash keeps from the store is found again by
        ``Backend.find`` in ``recover``, as before."""
        changes: list[dict[str, Any]] = []
        events: list[Event] = []
        for entry in entries:
            handle = self._launch(entry, now)
            if handle is not None:
                entry.handle = handle
                changes.append({"id": entry.row.id, "handle": handle.to_json()})
                events.append(Event(entry.row.id, "started", started_text(handle)))
        if changes:
            self.store.update_workloads(changes, events, now)

    def _launch(self, entry: RunningEntry, now: float) -> Handle | None:
        """Start the process of ``entry``; None when it could not start (the workload has then failed)."""
        spec = self._launch_spec(entry)
        entry.launched = True
        try:
            return self.backend.launch(spec)
        except (OSError, TesseraError) as exc:
            self._finish(entry, WorkloadState.FAILED, None, f"could not start: {exc}", now)
            return None

    def _devices(self, entry: RunningEntry) -> tuple[GpuDevice, ...]:
        return tuple(self.pool.device(p.node, g) for p in entry.placements for g in p.gpu_indices)

    def _launch_spec(self, entry: RunningEntry) -> LaunchSpec:
        row = entry.row
        devices = self._devices(entry)
        env = dict(row.env)
        mps = self.config.mps and bool(devices)
        env.update(isolation_env(str(row.id), devices, _share_milli(entry), row.gpu_mem_mib, mps=mps))
        if self.config.mps and devices and row.gpu_compute_pct:  # an explicit compute share (--gpu-compute)
            env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(row.gpu_compute_pct)
        if not self._logs_made:
            self.log_path(row.id).parent.mkdir(parents=True, exist_ok=True)
            self._logs_made = True
        return LaunchSpec(str(row.id), tuple(row.command), env, self.log_path(row.id))

    def log_path(self, workload_id: int) -> Path:
        return self._logs_dir / f"{workload_id}.log"

    def _watched(self) -> list[Watched]:
        return [
            Watched(str(wid), entry.handle, self._devices(entry), _share_milli(entry), entry.row.gpu_mem_mib)
            for wid, entry in self.running.items()
            if entry.handle is not None and entry.stop_sent is None and entry.placements
        ]

    def _stop_for_memory(self, workload_id: str, reason: str) -> None:
        entry = self.running[int(workload_id)]
        entry.stop_sent = f"{WATCHDOG}: {reason}"
        self.store.update_workloads(
            [{"id": entry.row.id, "stop_reason": entry.stop_sent[:200]}],
            [Event(entry.row.id, WATCHDOG, reason)],
            self.clock(),
        )
        self.backend.stop(workload_id, self.config.stop_grace_s)

    def _send_cancels(self, now: float) -> None:
        wanted = self.store.cancel_requested_ids()
        for wid in wanted:
            entry = self.running.get(wid)
            if entry is None or entry.stop_sent == "cancel":
                continue
            if not entry.launched:
                self._finish(entry, WorkloadState.CANCELLED, None, "cancelled before it started", now)
                continue
            entry.stop_sent = "cancel"
            self.store.update_workloads([{"id": wid, "stop_reason": "cancel"}], [], now)
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
        if entry.stop_sent == "cancel":
            self._finish(entry, WorkloadState.CANCELLED, code, "cancelled", now)
        elif entry.stop_sent is not None and entry.stop_sent.startswith(WATCHDOG):
            self._finish(entry, WorkloadState.FAILED, code, entry.stop_sent, now)
        elif entry.stop_sent is not None:  # preempted
            if self.config.requeue_preempted:
                self._requeue(entry, f"{entry.stop_sent}; requeued", now)
            else:
                self._finish(entry, WorkloadState.PREEMPTED, code, entry.stop_sent, now)
        elif row.kind == "service" and row.attempts <= self.config.service_max_restarts:
            self._requeue(entry, f"service exited ({exit_text(code)}); restarting", now)
        elif code == 0:
            self._finish(entry, WorkloadState.SUCCEEDED, code, "exit code 0", now)
        else:
            self._finish(entry, WorkloadState.FAILED, code, exit_text(code), now)

    def _finish(self, entry: RunningEntry, state: WorkloadState, code: int | None, reason: str, now: float) -> None:
        wid = entry.row.id
        self._release(entry)
        self.running.pop(wid, None)
        self.guard = self.guard.forget([str(wid)])
        change = {"id": wid, "state": state.value, "exit_code": code, "finished_at": now, "reason": reason}
        self.store.update_workloads([change], [Event(wid, state.value, reason)], now)

    def _requeue(self, entry: RunningEntry, reason: str, now: float) -> None:
        wid = entry.row.id
        self._release(entry)
        self.running.pop(wid, None)
        change = {
            "id": wid,
            "state": PENDING,
            "placement": None,
            "admission": None,
            "stop_reason": None,
            "handle": None,
            "reason": reason,
            "exit_code": None,
        }
        self.store.update_workloads([change], [Event(wid, "requeued", reason)], now)

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
            self._recharge(entry)

    def _recharge(self, entry: RunningEntry) -> None:
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
        """Rebuild the in-memory view from the store after a (re)start; returns how many workloads were running."""
        self._refresh_queues()
        now = self.clock()
        rows = self.store.workloads_in([RUNNING])
        for row in sorted(rows, key=lambda r: r.id):
            self._recover_one(row, now)
        self.snapshot = self._snapshot()
        return len(rows)

    def _recover_one(self, row: WorkloadRow, now: float) -> None:
        request = request_of(row)
        preempted = row.stop_reason is not None and row.stop_reason.startswith("preempted")
        try:
            placements = () if preempted else tuple(placement_of(p, request, self.pool) for p in row.placement or [])
            for placement in placements:
                self.state.bind(placement)
        except (KeyError, InvalidRequestError) as exc:
            log.warning("workload %s: stored placement no longer fits the pool (%s)", row.id, exc)
            placements = ()
        admission = admission_of(row.admission)
        entry = RunningEntry(row, placements, admission, row.started_at or now, False, stop_sent=row.stop_reason)
        self.running[row.id] = entry
        self._recharge(entry)
        handle = handle_of(row) or self.backend.find(str(row.id))
        if handle is not None:
            entry.launched = True
            entry.handle = handle
            self.backend.adopt(handle)
            if entry.stop_sent is not None:
                self.backend.stop(str(row.id), self.config.stop_grace_s)
        elif preempted:
            self._requeue(entry, f"{row.stop_reason}; requeued", now)
        elif not placements and row.placement:
            self._requeue(entry, "the GPU pool changed while the server was down; requeued", now)

    # ------------------------------------------------------------------------------------------------ running

    def run_forever(self, stop: Callable[[], bool]) -> None:
        """Step every ``interval_s`` until ``stop()`` says so; a failing step is logged and retried."""
        while not stop():
            try:
                self.step()
            except Exception:
                log.exception("scheduling step failed; retrying")
            time.sleep(self.config.interval_s)


def _share_milli(entry: RunningEntry) -> int:
    """The share of each GPU the workload holds (all its workers hold the same)."""
    return max((p.gpu_milli_each for p in entry.placements), default=0)
