"""The scheduler loop's elastic resizes (``server.loop.SchedulerLoop`` is made of this, its ends and stops, and its
step): a ``Shrink`` or ``Grow`` that ``Scheduler.commit`` applied to the books, stored with the tick's decisions,
then carried out on the processes.

The contract with the program (docs/control-plane.md): a resize stops every rank (SIGTERM, then SIGKILL after the
stop grace) and starts the ranks again on the new placements, with the new ``WORLD_SIZE``; the program resumes from
its own checkpoint (``TESSERA_RESTARTS`` counts the launches before). A resize is stored as the workload's new
placement and quota charge and a stop whose reason is ``resize: ...``; when the old ranks have exited, the relaunch
is stored (``RelaunchChange``) and the loop launches it. The workloads bound with capacity a shrink gave up wait
until the old ranks have exited, like a preemption's preemptor (``RunningEntry.waits_for``). A restarted server
finds a resize in the stored stop: the old ranks still running are stopped again, and an end (or no process at all)
relaunches the workload on its stored placement.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from tessera.backends.base import Backend
from tessera.core.decisions import Grow, RunningWorkload, Shrink
from tessera.core.scheduler import Scheduler
from tessera.server.intake import Intake
from tessera.server.launcher import Launcher
from tessera.server.loop_ends import WriteBatch
from tessera.server.loop_values import RunningEntry, TickDecisions, TickResize
from tessera.server.pool import Pool
from tessera.server.records import admission_record, placement_record
from tessera.server.store.changes import (
    RelaunchChange,
    ResizeChange,
    StopChange,
    StopKind,
    StopReason,
    WorkloadChange,
)
from tessera.server.store.store import Event

log = logging.getLogger(__name__)


class Resizes:
    """A part of ``SchedulerLoop``, which owns these attributes (declared here for the type checker)."""

    backend: Backend
    scheduler: Scheduler
    launcher: Launcher
    intake: Intake
    pool: Pool
    running: dict[int, RunningEntry]
    _now: float  # the tick's time
    _tick: TickDecisions
    _writes: WriteBatch
    _send_stop: Callable[[str], None]

    def _resized(self, decision: Shrink | Grow, before: RunningWorkload | None, books_entry: RunningWorkload) -> None:
        """``commit`` applied a resize to the books: the entry follows it (a workload bound earlier in this tick
        only starts later, on the books' placements: nothing to record)."""
        wid = int(decision.workload_id)
        entry = self.running.get(wid)
        if entry is None or before is None:
            return
        row = entry.row
        settled = (row.gpu_s_settled, row.cpu_s_settled, row.settled_at)
        text = resize_text(decision, before, books_entry)
        resize = TickResize(decision, before, entry.placements, entry.admission, entry.stop_sent, settled, text)
        self._tick.resizes.append(resize)
        settle(entry, self._now)
        entry.placements = books_entry.placements
        entry.admission = None if str(wid) in self.scheduler.books.uncharged else books_entry.admission
        if isinstance(decision, Shrink):
            self.intake.offer.released()
        if entry.stop_sent is None:  # one already stopping (cancelled, over its walltime) ends as that stop says
            entry.stop_sent = StopReason.resize(text)

    def _resize_writes(self, tick: TickDecisions) -> tuple[list[WorkloadChange], list[Event]]:
        """What the store records of the tick's resizes: each workload's placement, charge and stop, and an event."""
        changes: list[WorkloadChange] = []
        events: list[Event] = []
        for resize in tick.resizes:
            entry = self.running[int(resize.decision.workload_id)]
            placement = [placement_record(p, self.pool) for p in entry.placements]
            row = entry.row
            at = row.settled_at if row.settled_at is not None else self._now  # settled by _resized
            admission = admission_record(entry.admission)
            changes.append(ResizeChange(row.id, placement, admission, row.gpu_s_settled, row.cpu_s_settled, at))
            if entry.stop_sent is not None:
                changes.append(StopChange(row.id, entry.stop_sent))
            kind = "shrunk" if isinstance(resize.decision, Shrink) else "grown"
            events.append(Event(row.id, kind, resize.text))
        return changes, events

    def _carry_out_resizes(self, tick: TickDecisions) -> None:
        """The tick's resizes are stored: stop the old ranks (a workload never started is simply launched later,
        on its new placements)."""
        for resize in tick.resizes:
            entry = self.running.get(int(resize.decision.workload_id))
            if entry is None or entry.stop_sent is None or entry.stop_sent.kind is not StopKind.RESIZE:
                continue
            if self.launcher.withdraw(entry):
                entry.stop_sent = None  # nothing ran: its launch (at the next launch_ready) has the new placements
                continue
            self._send_stop(str(entry.row.id))

    def _undo_resizes(self, tick: TickDecisions, now: float) -> None:
        """The tick's decisions were not stored: each resized workload gets its books entry and its own back."""
        for resize in reversed(tick.resizes):
            wid = resize.decision.workload_id
            entry = self.running.get(int(wid))
            if entry is None:
                continue
            entry.placements, entry.admission, entry.stop_sent = resize.placements, resize.admission, resize.stop
            entry.row.gpu_s_settled, entry.row.cpu_s_settled, entry.row.settled_at = resize.settled
            self.scheduler.observe([wid], now, finished=False)
            if not self.scheduler.restore(resize.before, self.intake.workload(entry.row), now):
                log.warning("workload %s: its workers could not be taken back after a failed step", wid)

    def _relaunch(self, entry: RunningEntry, now: float) -> None:
        """The old ranks of a resized workload have exited: it is launched again where the books place it now. The
        backend forgets the old launch first: a crash before the relaunch is stored finds nothing of it (the stored
        stop then relaunches it again), never its old end."""
        wid = entry.row.id
        try:
            self.backend.forget(str(wid))
        except Exception:
            log.exception("workload %s: the backend could not forget its last launch", wid)
        attempts = entry.row.attempts + 1
        workers = len(entry.placements)
        event = Event(wid, "restarted", f"on {workers} worker{'s' if workers != 1 else ''} after a resize")

        def relaunched() -> None:  # stored
            entry.row.attempts = attempts
            entry.launched, entry.handle, entry.stop_sent = False, None, None

        self._writes.write([RelaunchChange(wid, attempts)], [event], now, relaunched)


def settle(entry: RunningEntry, now: float) -> None:
    """What the run used on its current placement until ``now`` is added to its row's settled GPU- and CPU-seconds
    (accounting: ``tessera history``), and the next placement counts from ``now``."""
    row = entry.row
    start = row.settled_at if row.settled_at is not None else entry.started_s
    span_s = max(0.0, now - start)
    gpus = sum(len(p.gpu_indices) * p.gpu_milli_each for p in entry.placements) / 1000
    row.gpu_s_settled = (row.gpu_s_settled or 0.0) + gpus * span_s
    row.cpu_s_settled = (row.cpu_s_settled or 0.0) + row.cpu_milli / 1000 * max(1, len(entry.placements)) * span_s
    row.settled_at = now


def resize_text(decision: Shrink | Grow, before: RunningWorkload, after: RunningWorkload) -> str:
    """One line: how many workers before and after, and why."""
    old, new, changed = len(before.placements), len(after.placements), len(decision.placements)
    if isinstance(decision, Grow):
        return f"{old} -> {new} workers: grown into idle GPUs"
    return f"{old} -> {new} workers: gave {changed} back for workload {decision.preemptor}"
