"""The scheduler loop: the core's scheduling step on a wall clock, with the store as the source of truth.

One ``step()`` (a tick): record the launches made since the last tick, collect the workloads that ended
(``Backend.poll``; ``Scheduler.observe`` returns their capacity; their ends stored in one transaction), stop those
whose cancel was requested, run the memory watchdog, then every scheduling step of this instant
exactly as the simulator runs them (``core.pending.schedule_instant`` over the same ``PendingOffer``: the first
workload of each request shape, a failed shape again only after a release). Each plan is applied to the scheduler's
books with ``Scheduler.commit``, the very call the simulator makes, so the next plan of the tick builds on it; then
**all the tick's decisions are written to the store in one transaction** (typed changes, ``server.store.changes``)
and only then acted on (stop victims, launch through ``server.launcher``). Nothing acts before it is durable; a bind
that lost the race with a cancel is taken back out of the books.

A step never waits long for the backend: launches are made by a worker thread (``server.launch_worker``), waited
for at most ``LoopConfig.launch_wait_s``, their handles stored at a later step; so ends and cancels are handled every
interval even during a wave of launches. A workload stopped while its launch is queued is never started; one whose
launch is being made is stopped once its handle comes back. The scheduler comes from a preset (``core.presets``).
Held workloads, unmet dependencies and array limits are never offered, and walltimes are enforced (``server.gates``).

A restarted server calls ``recover()`` first (``server.recovery``). A typed ``StopReason`` (cancel, preempted,
watchdog) decides what an end means (``server.loop_ends``). A bind whose victims must go first launches once they
have exited (``waits_for``): never two processes on one share.

A step is a transaction (issue 25): whatever raises in it (no thread left, a store or ``/proc`` error), the next
step recovers. Memory changes only once the store took the writes (``WriteBatch``'s ``then``); a reported end is
kept until stored, then the backend forgets it (``Backend.forget``: until then a restarted server finds it rather
than launching it twice); the tick's plans and their write are one unit: whatever raises between the first plan and
the write takes all the tick's decisions back out of the books (``_undo``); a refused stop is sent again.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

from tessera.backends.base import Backend, ExitStatus
from tessera.core.cluster import ClusterState
from tessera.core.decisions import Decision, RunningWorkload
from tessera.core.pending import schedule_instant
from tessera.core.preset_knobs import with_knobs
from tessera.core.presets import build_scheduler, resolve_preset, scheduler_config
from tessera.core.queueing import QueueSpec
from tessera.core.scheduler import Bind, Grow, Preempt, Shrink, StepPlan
from tessera.core.throughput_defaults import default_models
from tessera.core.workload import WorkloadState
from tessera.gpu.gpus import ProcessMemoryProbe
from tessera.server.gates import Gate
from tessera.server.intake import Intake
from tessera.server.launcher import Launcher
from tessera.server.loop_ends import WriteBatch, preemption_writes
from tessera.server.loop_resizes import Resizes
from tessera.server.loop_stops import EndsAndStops
from tessera.server.loop_values import (
    ClusterSnapshot,
    LoopConfig,
    RunningEntry,
    StepReport,
    TickDecisions,
    Victim,
    cluster_snapshot,
    describe,
    reason_changes,
    watched,
)
from tessera.server.memory_watch import MemoryWatch
from tessera.server.pool import Pool
from tessera.server.records import admission_record, placement_record, queue_spec
from tessera.server.recovery import recover_running
from tessera.server.store.changes import BindChange, StopReason
from tessera.server.store.models import WorkloadRow
from tessera.server.store.store import Event, Store

log = logging.getLogger(__name__)

RUNNING = WorkloadState.RUNNING.value
SHUTDOWN_LAUNCH_WAIT_S = 10.0  # how long a stopping loop waits for the launch being made, to record its handle


class SchedulerLoop(EndsAndStops, Resizes):
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
        self.preset = with_knobs(resolve_preset(config.policy), config.knobs)
        self.throughput, self.colocation = config.job_models or default_models()
        self.scheduler = build_scheduler(
            self.preset,
            ClusterState(pool.nodes),
            seed=config.seed,
            max_attempts_per_step=config.max_tries_per_step,
            placement=config.placement,
            throughput=self.throughput,
            colocation=self.colocation,
        )
        self.running: dict[int, RunningEntry] = {}  # the server's side of a running workload: row, process, stop
        self.launcher = Launcher(store, backend, pool, config, self._launch_failed, self._send_stop)
        self.memory_watch = (
            MemoryWatch(memory_probe, self._stop_for_memory, backend.pids) if memory_probe is not None else None
        )
        self.intake = Intake(self.preset, lambda: self.scheduler)
        self.gate = Gate(store)  # held, dependencies, array limits: what the step is not offered (server.gates)
        self._now = 0.0  # the current tick's time
        self._tick = TickDecisions()  # the current tick's decisions, stored together by _flush
        self._before: dict[str, RunningWorkload] = {}  # a plan's resized workloads in the books before its commit
        self._preemptions = itertools.count(1)
        self._preempted_order: dict[int, int] = {}  # preempted workloads not yet ended -> in which order
        self._reasons: dict[int, str] = {}  # pending workload -> why it waits, as stored
        self._unstored_ends: list[ExitStatus] = []  # reported by the backend, not stored yet (kept across steps)
        self._unsent_stops: set[int] = set()  # stops stored but refused by the backend: sent again
        self._stops_failed: set[int] = set()  # of those, the ones whose failure's traceback was logged
        self._writes = WriteBatch(store)  # end and stop writes, held by _writes.batched for one transaction
        self._wake = threading.Event()  # set by wake(): run_forever steps at once instead of after its interval
        self.queue_specs: tuple[QueueSpec, ...] = ()
        self.snapshot = self._snapshot()

    @property
    def placement(self) -> str:
        """The placement policy in effect: ``--placement``, else the preset's own."""
        return self._config.placement or self.preset.placement

    @property
    def job_types(self) -> tuple[str, ...]:
        """The job types a submission may name (``--job-type``): those of the throughput model."""
        return self.throughput.job_types

    @property
    def state(self) -> ClusterState:
        return self.scheduler.state

    @property
    def config(self) -> LoopConfig:
        return self._config

    @config.setter
    def config(self, config: LoopConfig) -> None:  # applies to the next step, launches included
        self._config = config
        self.launcher.config = config

    # ----------------------------------------------------------------------------------------------- the step

    def step(self) -> StepReport:
        """One tick: launches made, ends, cancels, the watchdog, held launches, then every scheduling step of this
        instant (``core.pending.schedule_instant``, as the simulator runs them), then a short wait for this tick's
        launches (``Launcher.settle``)."""
        started, started_cpu = time.perf_counter(), time.thread_time()
        now = self.clock()
        self._now = self.intake.now_s = now
        self._refresh_queues()
        self.launcher.collect(self.running, now)
        ended = self._collect_exits(now)
        self._send_cancels(now)
        self._end_unstarted(now)
        if self.memory_watch is not None:
            self.memory_watch.check(now, watched(self.running, self.launcher.devices))
        self.intake.recheck(now)
        self.launcher.launch_ready(self.running, now)
        stored = self.gate.eligible(now)
        for gone in self.intake.sync(stored, self.store.pending_requests):
            self._reasons.pop(gone, None)
        offer, offered, limit = self.intake.offer, self.intake.offered, self.config.max_tries_per_step
        try:  # the tick's plans and their write are one unit: whatever raises before the write undoes them all
            schedule_instant(self.scheduler, offer, now, offered, self._apply, self.preset.borrowing, limit)
        except BaseException:
            self._undo(self._take_tick(), now)
            raise
        binds, preempts = self._flush(now)
        self.launcher.settle(self.running, now)
        self.snapshot = self._snapshot()
        duration_s, cpu_s = time.perf_counter() - started, time.thread_time() - started_cpu
        report = StepReport(binds, preempts, ended, len(stored), duration_s, cpu_s)
        if self.on_step is not None:
            self.on_step(report)
        return report

    def _apply(self, plan: StepPlan) -> None:
        """One plan of this tick: committed to the scheduler's books at once (the next plan of the tick builds on
        it), each decision recorded in the tick as ``commit`` applies it (``_applied``: a commit that raises part way
        leaves nothing in the books that ``_undo`` does not know), for ``_flush``, which makes the tick's decisions
        durable in one transaction before anything acts on them."""
        tick = self._tick
        if tick.guard is None:
            tick.guard = self.scheduler.books.guard
        books = self.scheduler.books.running
        resized = [r.workload_id for r in plan.shrinks] + [r.workload_id for r in plan.grows]
        self._before = {wid: books[wid] for wid in resized}
        self.scheduler.commit(plan, self._now, self._applied)
        tick.waiting.update(self.intake.offer.reasons(plan.waiting))

    def _applied(self, decision: Decision, books_entry: RunningWorkload) -> None:
        """A decision ``Scheduler.commit`` has just applied to the books: recorded in the tick first, then followed
        (a victim's entry gives up its capacity, a bound workload leaves the intake, a resized one restarts on its
        new workers: ``loop_resizes``)."""
        tick = self._tick
        if isinstance(decision, Preempt):
            wid = int(decision.workload_id)
            entry = self.running.get(wid)
            self.intake.offer.released()
            if entry is None:  # bound by an earlier plan of this very tick (a reclaim may do it): it waits again
                tick.unbind(wid)
                return
            tick.victims.setdefault(wid, Victim(entry.placements, entry.admission, entry.stop_sent, books_entry))
            tick.preempts.append(decision)
            entry.placements, entry.admission = (), None  # its capacity went to the preemptor
            entry.stop_sent = StopReason.preempted(decision.reason)
            self._preempted_order[wid] = next(self._preemptions)
        elif isinstance(decision, Shrink | Grow):
            self._resized(decision, self._before.get(decision.workload_id), books_entry)
        elif isinstance(decision, Bind):
            # Victims decided so far, and workloads that gave workers back, must have exited first.
            waits = {int(p.workload_id) for p in tick.preempts}
            waits.update(int(r.decision.workload_id) for r in tick.resizes if isinstance(r.decision, Shrink))
            tick.binds.append((decision, waits))
            tick.taken.append(self.intake.bound(decision.workload_id))

    def _take_tick(self) -> TickDecisions:
        """The tick's decisions, for ``_flush`` or ``_undo``; the next tick starts with none."""
        tick, self._tick = self._tick, TickDecisions()
        return tick

    def _flush(self, now: float) -> tuple[int, int]:
        """Store the tick's decisions in one transaction, then act: stop victims, launch what need not wait. A bind
        that lost the race with a cancel is taken back out of the books. Returns (binds, preemptions)."""
        tick = self._take_tick()
        try:
            bound, lost = self._store_tick(tick, now)
        except BaseException:
            self._undo(tick, now)
            raise
        bound = [entry for entry in bound if entry.row.id not in lost]
        for entry in bound:  # stored: running, whatever raises after this (the next launch_ready launches them)
            self.running[entry.row.id] = entry
        self.scheduler.observe([str(wid) for wid in lost], now, finished=False)
        for entry in bound:
            self._reasons.pop(entry.row.id, None)
            self.intake.started(str(entry.row.id), now)
        self._stop_victims(tick.preempts, now)
        self._carry_out_resizes(tick)
        if self.on_start is not None:
            for entry in bound:
                self.on_start(entry.row, now - entry.row.submitted_at)
        self.launcher.launch_all([entry for entry in bound if not entry.waits_for], now)
        return len(bound), len(tick.preempts)

    def _store_tick(self, tick: TickDecisions, now: float) -> tuple[list[RunningEntry], set[int]]:
        """Write the tick's decisions in one transaction; returns the bound entries and the binds lost to a cancel.
        The backend first forgets the last launch of one bound again, which a crash before the new one would find."""
        changes, events = preemption_writes(tick.preempts)
        resized, resize_events = self._resize_writes(tick)
        changes += resized
        events += resize_events
        rows = {row.id: row for row in self.store.workloads_by_id(int(b.workload_id) for b, _ in tick.binds)}
        for row in rows.values():
            if row.attempts > 0:
                self._forget(str(row.id))
        bound = [self._entry(bind, rows[int(bind.workload_id)], now, waits) for bind, waits in tick.binds]
        bind_changes = [self._bind_change(entry, now) for entry in bound]
        events += [Event(entry.row.id, "bound", describe(entry, self.pool)) for entry in bound]
        reasons = reason_changes(tick.waiting, self.intake.pending.keys(), self._reasons)
        lost = self.store.commit_decisions(bind_changes, reasons, changes, events, now)
        self._reasons.update((change.workload_id, change.reason) for change in reasons)
        return bound, lost

    def _undo(self, tick: TickDecisions, now: float) -> None:
        """The tick's decisions were not stored: the binds give their capacity back (still pending in the store, the
        intake offers them again first), the victims (nothing was sent to them) get theirs back, their LAS service as
        it was (``Scheduler.restore``). Whatever else is in the books and not running here was bound by the tick too
        (a bind that raised as ``commit`` applied it)."""
        self._undo_resizes(tick, now)
        unbound = {bind.workload_id for bind, _ in tick.binds}
        unbound.update(wid for wid in self.scheduler.books.running if int(wid) not in self.running)
        self.scheduler.observe(sorted(unbound), now, finished=False)
        for wid, victim in tick.victims.items():
            entry = self.running[wid]
            entry.placements, entry.admission, entry.stop_sent = victim.placements, victim.admission, victim.stop
            self._preempted_order.pop(wid, None)
            if not self.scheduler.restore(victim.books, self.intake.workload(entry.row), now):
                log.warning("workload %s: its placement could not be taken back after a failed step", wid)
                continue
            if str(wid) in self.scheduler.books.uncharged:
                entry.admission = None
            if entry.stop_sent is not None:
                self.scheduler.books.stopping.add(str(wid))
        if tick.guard is not None:
            self.scheduler.books.guard = tick.guard
        self.intake.put_back(tick.taken)  # at the head of their lines: they keep their place
        self.intake.offer.released()
        log.warning(
            "the step's decisions were not stored: %d binds, %d preemptions undone", len(unbound), len(tick.victims)
        )

    def _entry(self, bind: Bind, row: WorkloadRow, now: float, waits: set[int]) -> RunningEntry:
        """The server's entry of a bound workload, launched once the victims still running have exited."""
        books = self.scheduler.books.running[bind.workload_id]  # a grow of the same tick is in it
        charged = None if str(row.id) in self.scheduler.books.uncharged else books.admission
        waits = {v for v in waits if v in self.running}
        return RunningEntry(row, books.placements, charged, now, launched=False, waits_for=waits)

    def _bind_change(self, entry: RunningEntry, now: float) -> BindChange:
        row = entry.row
        row.attempts += 1
        row.gpu_s_settled, row.cpu_s_settled, row.settled_at = 0.0, 0.0, None  # a new run counts from its start
        records = [placement_record(p, self.pool) for p in entry.placements]
        return BindChange(row.id, records, admission_record(entry.admission), now, row.attempts)

    def log_path(self, workload_id: int) -> Path:
        return self.launcher.log_path(workload_id)

    def _snapshot(self) -> ClusterSnapshot:
        return cluster_snapshot(self.state, self.running, self.scheduler.ledger, self.queue_specs)

    # ------------------------------------------------------------------------------------------------ queues

    def _refresh_queues(self) -> None:
        specs = tuple(queue_spec(row) for row in self.store.queues())
        if specs == self.queue_specs:
            return
        self.intake.reset(own_queues=bool(specs))
        config = scheduler_config(self.preset, self.state, specs, self.config.max_tries_per_step)
        self.scheduler.reconfigure(config)
        self.queue_specs = specs  # applied: a step that failed before this line applies them again
        for wid, entry in self.running.items():
            if entry.admission is not None and str(wid) in self.scheduler.books.uncharged:
                log.warning("workload %s no longer fits its queue's quota: it keeps running, uncharged", wid)
                entry.admission = None

    def adopt(self, entry: RunningEntry) -> bool:
        """Take a recovered running workload into the scheduler's books (bound, its quota charged again); False
        when its placements no longer fit the pool."""
        wid = str(entry.row.id)
        if entry.placements:
            workload = self.intake.workload(entry.row)
            if not self.scheduler.adopt(workload, entry.placements, entry.admission, entry.started_s):
                return False
            if wid in self.scheduler.books.uncharged:
                entry.admission = None
            if entry.stop_sent is not None:
                self.scheduler.books.stopping.add(wid)
        self.running[entry.row.id] = entry
        return True

    # ---------------------------------------------------------------------------------------------- recovery

    def recover(self) -> int:
        """Rebuild the in-memory view from the store after a (re)start (``server.recovery``); returns how many
        workloads were running."""
        self._refresh_queues()
        now = self.clock()
        rows = self.store.workloads_in([RUNNING])
        recover_running(rows, self, self.backend, self.pool, self.config.stop_grace_s, now, self.store)
        # Which victims a bound workload waited for is not stored: one not started yet waits for every workload
        # still stopping (preempted, or shrunk by a resize), so that it never starts on a share they still use.
        stopping = {wid for wid, entry in self.running.items() if entry.stop_sent is not None and entry.launched}
        for wid, entry in self.running.items():
            if not entry.launched and entry.stop_sent is None:
                entry.waits_for = stopping - {wid}
        self.snapshot = self._snapshot()
        return len(rows)

    # ------------------------------------------------------------------------------------------------ running

    def wake(self) -> None:
        """Step now rather than at the end of the interval (a cancel was requested: it takes effect at once)."""
        self._wake.set()

    def _pause_s(self) -> float:
        """The interval, or a quarter of it while a stop was sent and its workload has not ended yet, so that the
        end (of a cancel, a preemption's victim) is recorded soon after the process exits."""
        stopping = any(entry.stop_sent is not None and entry.launched for entry in self.running.values())
        return self.config.interval_s / 4 if stopping else self.config.interval_s

    def run_forever(self, stop: Callable[[], bool]) -> None:
        """Step every ``interval_s`` until ``stop()`` says so; a failing step is logged and retried. At the end,
        launches not begun are dropped (a restarted server makes them) and the one being made is recorded."""
        while not stop():
            try:
                self.step()
            except Exception:
                log.exception("scheduling step failed; retrying")
            self._wake.wait(self._pause_s())
            self._wake.clear()
        self.launcher.shut_down(self.running, self.clock(), SHUTDOWN_LAUNCH_WAIT_S)
