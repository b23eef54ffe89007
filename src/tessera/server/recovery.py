"""Recovery after a (re)start: rebuild the scheduler loop's view of the running workloads from the store.

For each workload stored as running: take it into the scheduler's books with its stored placements (none for one whose
preemption was sent: its capacity went to the preemptor) and its quota charged again (``SchedulerLoop.adopt``,
``Scheduler.adopt``), and re-adopt it through the backend from its stored handle, or from the one ``Backend.find`` still
knows when the crash came between launch and write (then the found handle is stored, so that its end, once collected, is
never lost to a second crash: without a stored handle and once the backend has forgotten the workload, a restart would
launch it again). ``find`` also finds a launch whose end the backend reported to a server that died before it stored
that end (the backend forgets a launch only when the loop says so, ``Backend.forget``): adopted, that end is reported
again and recorded, and the workload is not launched a second time. A workload that has no handle anywhere was
never started (``find`` answers for launches cut short too) and is launched by the loop's next step. A stop that was
sent is sent again. A preempted workload that is gone is requeued, and so is one whose placement no longer fits the
pool. Called by ``SchedulerLoop.recover`` before the first step.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Protocol

from tessera.backends.base import Backend, Handle
from tessera.errors import InvalidRequestError
from tessera.server.loop_values import RunningEntry, started_text
from tessera.server.pool import Pool
from tessera.server.records import admission_of, handle_of, placement_of, request_of
from tessera.server.store.changes import HandleChange, StopKind, StopReason
from tessera.server.store.models import WorkloadRow
from tessera.server.store.store import Event, Store

log = logging.getLogger(__name__)


class Books(Protocol):
    """What recovery rebuilds: the scheduler's books and the loop's running table (``SchedulerLoop``)."""

    def adopt(self, entry: RunningEntry) -> bool: ...

    def requeue(self, entry: RunningEntry, reason: str, now: float) -> None: ...


def recover_running(
    rows: Iterable[WorkloadRow],
    books: Books,
    backend: Backend,
    pool: Pool,
    stop_grace_s: float,
    now: float,
    store: Store,
) -> None:
    """Rebuild ``books`` from the running workloads ``rows``, in id order; store the handles ``find`` found."""
    found: list[HandleChange] = []
    for row in sorted(rows, key=lambda r: r.id):
        handle = _recover_one(row, books, backend, pool, stop_grace_s, now)
        if handle is not None:
            found.append(HandleChange(row.id, handle))
    if found:
        events = [Event(f.workload_id, "found", f"{started_text(f.handle)}; found after a restart") for f in found]
        store.update_workloads(found, events, now)
        log.warning("found %d launched workloads whose handles had not been stored", len(found))


def _recover_one(
    row: WorkloadRow, books: Books, backend: Backend, pool: Pool, stop_grace_s: float, now: float
) -> Handle | None:
    """Recover one workload; returns the handle ``Backend.find`` found for it (None if stored or not found)."""
    request = request_of(row)
    stop = StopReason.parse(row.stop_reason) if row.stop_reason is not None else None
    preempted = stop is not None and stop.kind is StopKind.PREEMPTED
    try:
        placements = () if preempted else tuple(placement_of(p, request, pool) for p in row.placement or [])
    except (KeyError, InvalidRequestError) as exc:
        log.warning("workload %s: stored placement no longer fits the pool (%s)", row.id, exc)
        placements = ()
    admission = admission_of(row.admission)
    entry = RunningEntry(row, placements, admission, row.started_at or now, False, stop_sent=stop)
    if not books.adopt(entry):
        log.warning("workload %s: stored placement no longer fits the pool", row.id)
        entry.placements = ()
        books.adopt(entry)
    stored = handle_of(row)
    handle = stored or backend.find(str(row.id))
    if handle is not None:
        entry.launched = True
        entry.handle = handle
        backend.adopt(handle)
        if entry.stop_sent is not None:
            backend.stop(str(row.id), stop_grace_s)
    elif stop is not None and preempted:
        books.requeue(entry, f"{stop.text()}; requeued", now)
    elif not entry.placements and row.placement:
        books.requeue(entry, "the GPU pool changed while the server was down; requeued", now)
    return None if stored is not None else handle
