"""The scheduler loop's ends and stops (``server.loop.SchedulerLoop`` is made of this and its step): the ends the
backend reports, stored in one transaction and then taken out of the books; cancels and walltimes, stored, then
signalled; the watchdog's stops; requeues. Memory changes only once the store took the writes (``WriteBatch``'s
``then``); a reported end is kept until stored, then the backend forgets it; a stop the backend refused is sent
again at the next step."""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial

from tessera.backends.base import Backend, ExitStatus
from tessera.core.scheduler import Preempt, Scheduler
from tessera.core.workload import WorkloadState
from tessera.server.gates import overdue
from tessera.server.intake import Intake
from tessera.server.launcher import Launcher
from tessera.server.loop_ends import WriteBatch, end_outcome
from tessera.server.loop_values import LoopConfig, RunningEntry
from tessera.server.store.changes import EndChange, RequeueChange, StopChange, StopKind, StopReason
from tessera.server.store.store import Event, Store

log = logging.getLogger(__name__)


class EndsAndStops:
    """A part of ``SchedulerLoop``, which owns these attributes (declared here for the type checker)."""

    store: Store
    backend: Backend
    scheduler: Scheduler
    launcher: Launcher
    intake: Intake
    running: dict[int, RunningEntry]
    clock: Callable[[], float]
    _writes: WriteBatch
    _unstored_ends: list[ExitStatus]
    _unsent_stops: set[int]
    _stops_failed: set[int]  # workloads whose last stop failed (its traceback logged): later failures in one line
    _preempted_order: dict[int, int]
    _relaunch: Callable[[RunningEntry, float], None]

    @property
    def config(self) -> LoopConfig:
        raise NotImplementedError

    def _stop_for_memory(self, workload_id: str, reason: str) -> None:
        entry = self.running[int(workload_id)]
        stop = StopReason.watchdog(reason)
        event = Event(entry.row.id, StopKind.WATCHDOG.value, reason)
        self.store.update_workloads([StopChange(entry.row.id, stop)], [event], self.clock())
        entry.stop_sent = stop
        self.scheduler.books.stopping.add(workload_id)
        self._send_stop(workload_id)

    def _send_stop(self, workload_id: str) -> None:
        """Stop a workload whose stop is stored; one the backend refuses (an error) is sent again next step. The
        first failure logs its traceback, those after it one line each until a stop goes out."""
        wid = int(workload_id)
        try:
            self.backend.stop(workload_id, self.config.stop_grace_s)
        except Exception as exc:
            if wid in self._stops_failed:
                log.warning("workload %s: the stop failed again (%s); it is sent again at the next step", wid, exc)
            else:
                log.exception("workload %s: the stop failed; it is sent again at the next step", workload_id)
                self._stops_failed.add(wid)
            self._unsent_stops.add(wid)
        else:
            self._stops_failed.discard(wid)

    def _send_cancels(self, now: float) -> None:
        """Stop the workloads whose cancel was requested or whose walltime is over (``gates.overdue``: they fail),
        stored, then signalled; one never started (launch still queued) ends at once, one whose launch is being made
        is stopped when its handle comes back (``Launcher.collect``)."""
        wanted = [(wid, StopReason.cancel()) for wid in self.store.cancel_requested_ids()] + overdue(self.running, now)
        stops: list[str] = []
        seen: set[int] = set()  # one stop each (a cancel first): its entry changes only once the batch is stored
        with self._writes.batched(now):
            for wid, stop in wanted:
                entry = self.running.get(wid)
                if entry is None or entry.stop_sent == StopReason.cancel() or wid in seen:
                    continue
                seen.add(wid)
                cancel = stop.kind is StopKind.CANCEL
                if self.launcher.withdraw(entry):
                    why = "cancelled before it started" if cancel else stop.detail
                    self._finish(entry, WorkloadState.CANCELLED if cancel else WorkloadState.FAILED, None, why, now)
                    continue
                events = [] if cancel else [Event(wid, "timeout", stop.detail)]
                self._writes.write([StopChange(wid, stop)], events, now, partial(self._stopping, entry, stop))
                stops.append(str(wid))
        for wid_text in stops:
            self._send_stop(wid_text)

    def _stopping(self, entry: RunningEntry, stop: StopReason) -> None:  # its stop is stored
        entry.stop_sent = stop
        self.scheduler.books.stopping.add(str(entry.row.id))

    def _collect_exits(self, now: float) -> int:
        """Ends the backend reports, stored in one transaction; preempted workloads that ended together are requeued
        in the order they were preempted (their processes may exit in any order), as the simulator requeues them.
        An end reported before its launch's handle was recorded is kept for the step that records it, any end until
        it is stored; then the backend forgets the launch (until then ``Backend.find`` finds it after a crash)."""
        self._unstored_ends.extend(self.backend.poll())
        statuses = sorted(self._unstored_ends, key=lambda s: self._preempted_order.get(int(s.workload_id), 0))
        early: list[ExitStatus] = []
        done: dict[str, bool] = {}  # workload id -> whether it was one of ours
        with self._writes.batched(now):
            for status in (s for s in statuses if s.workload_id not in done):
                entry = self.running.get(int(status.workload_id))
                if entry is None:
                    log.warning("backend reported the end of unknown workload %s", status.workload_id)
                    done[status.workload_id] = False
                elif entry.launched and entry.handle is None:  # the launch's outcome comes at the next collect
                    early.append(status)
                else:
                    self._on_exit(entry, status, now)
                    done[status.workload_id] = True
        self._unstored_ends = early
        for workload_id in done:
            self._preempted_order.pop(int(workload_id), None)
            self._forget(workload_id)
        return sum(done.values())

    def _forget(self, workload_id: str) -> None:
        try:  # what the backend keeps of the workload's last launch (its end is stored): dropped
            self.backend.forget(workload_id)
        except Exception:
            log.exception("workload %s: the backend could not forget its last launch", workload_id)

    def _on_exit(self, entry: RunningEntry, status: ExitStatus, now: float) -> None:
        """The workload's process ended: it ends as ``loop_ends.end_outcome`` says, or waits again, or, stopped to
        be resized, is launched again on its new workers (``loop_resizes``)."""
        if entry.stop_sent is not None and entry.stop_sent.kind is StopKind.RESIZE:
            self._relaunch(entry, now)
            return
        outcome = end_outcome(entry.stop_sent, entry.row, status.exit_code, self.config)
        if outcome.state is None:
            self.requeue(entry, outcome.reason, now)
        else:
            self._finish(entry, outcome.state, status.exit_code, outcome.reason, now)

    def _finish(self, entry: RunningEntry, state: WorkloadState, code: int | None, reason: str, now: float) -> None:
        """``entry`` ends in ``state``: stored, then taken out of the books."""
        wid = entry.row.id
        change = EndChange(wid, state, code, now, reason)
        self._writes.write([change], [Event(wid, state.value, reason)], now, partial(self._observe, wid, now, True))

    def _observe(self, wid: int, now: float, finished: bool) -> None:
        """``wid`` stopped: its capacity (if it still held any) goes back, and failed shapes are tried again."""
        self._preempted_order.pop(wid, None)
        self._stops_failed.discard(wid)
        if str(wid) in self.scheduler.books.running:
            self.intake.offer.released()
        self.scheduler.observe([str(wid)], now, finished=finished)
        self.running.pop(wid, None)

    def _launch_failed(self, entry: RunningEntry, reason: str, now: float) -> None:
        """A launch that could not start: the workload failed, unless a stop was decided meanwhile (then it ends
        as that stop says: cancelled, or requeued when preempted)."""
        if entry.stop_sent is None:
            self._finish(entry, WorkloadState.FAILED, None, reason, now)
        else:
            self._on_exit(entry, ExitStatus(str(entry.row.id), None), now)

    def requeue(self, entry: RunningEntry, reason: str, now: float) -> None:
        """``entry`` waits again: stored, then its capacity and quota are given back, and it joins the offer
        (workloads requeued together join in the order they stopped, as the simulator's preempted jobs do)."""
        wid = entry.row.id
        then = partial(self._requeued, entry, now)
        self._writes.write([RequeueChange(wid, reason)], [Event(wid, "requeued", reason)], now, then)

    def _requeued(self, entry: RunningEntry, now: float) -> None:  # its requeue is stored
        self._observe(entry.row.id, now, finished=False)
        self.intake.add(entry.row)

    def _end_unstarted(self, now: float) -> None:
        """Send again the stops the backend refused; end the workloads stopped before their launch began (left by a
        step that failed after taking the launch back, or by recovery: a stored stop, never started)."""
        unsent, self._unsent_stops = self._unsent_stops, set()
        for wid in sorted(unsent & self.running.keys()):
            self._send_stop(str(wid))
        unstarted = [e for e in self.running.values() if not e.launched and e.stop_sent is not None]
        with self._writes.batched(now):
            for entry in unstarted:
                self._on_exit(entry, ExitStatus(str(entry.row.id), None), now)

    def _stop_victims(self, preempts: list[Preempt], now: float) -> None:
        """Stop the preempted workloads; one whose process was never started (its launch still queued, or waiting
        for victims of its own) has nothing to stop: it ends now, and the workloads waiting for it may launch."""
        with self._writes.batched(now):
            for preempt in preempts:
                victim = self.running.get(int(preempt.workload_id))
                if victim is not None and self.launcher.withdraw(victim):
                    self._on_exit(victim, ExitStatus(preempt.workload_id, None), now)
                else:
                    self._send_stop(preempt.workload_id)
