"""The store's side of the job options (revision 0005): submitting an array's workloads together, hold and release,
and what the loop's gate (``server.gates``) reads and writes each tick: the pending workloads' hold, dependency and
array columns, the states of the workloads they depend on, and the reasons and ends it decides. Every write here
applies only to a workload that is still pending (a cancel that came in first wins).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import Row, func, select, update

from tessera.core.workload import WorkloadState
from tessera.server.store.bulk import chunks
from tessera.server.store.models import EventRow, WorkloadRow
from tessera.server.store.store import Store

PENDING = WorkloadState.PENDING.value
RUNNING = WorkloadState.RUNNING.value
GATE_COLUMNS = (
    WorkloadRow.id,
    WorkloadRow.held,
    WorkloadRow.dependency,
    WorkloadRow.array_id,
    WorkloadRow.array_index,
    WorkloadRow.array_limit,
    WorkloadRow.reason,
)
GateRow = Row[Any]  # the GATE_COLUMNS of one pending workload


def add_workloads(store: Store, rows: Sequence[WorkloadRow], now_s: float) -> list[WorkloadRow]:
    """Insert ``rows`` in one transaction; the tasks of an array (rows with an ``array_index``) get the id of the
    first as their ``array_id``."""
    with store.session() as session, session.begin():
        session.add_all(rows)
        session.flush()
        if rows and rows[0].array_index is not None:
            for row in rows:
                row.array_id = rows[0].id
        for row in rows:
            array = f" (array {row.array_id}, index {row.array_index})" if row.array_id is not None else ""
            message = f"submitted to queue {row.queue} by tenant {row.tenant}{array}" + (", held" if row.held else "")
            session.add(EventRow(workload_id=row.id, at=now_s, kind="submitted", message=message))
    return list(rows)


def set_held(store: Store, workload_id: int, held: bool, now_s: float) -> tuple[WorkloadRow | None, bool]:
    """Hold (or release) pending workload ``workload_id``: (its row, True), or (its row, False) when it is not
    pending (only a pending workload is held; releasing one that is not held changes nothing)."""
    with store.session() as session, session.begin():
        row = session.get(WorkloadRow, workload_id, with_for_update=True)
        if row is None or row.state != PENDING or row.cancel_requested:
            return row, False
        if row.held != held:
            row.held = held
            row.reason = "held" if held else "released; waiting for the next scheduling step"
            kind = "held" if held else "released"
            session.add(EventRow(workload_id=row.id, at=now_s, kind=kind, message=row.reason))
        return row, True


def pending_gates(store: Store) -> list[GateRow]:
    """Every pending workload's id, hold, dependency and array columns and stored reason (not its request)."""
    with store.session() as session:
        return list(session.execute(select(*GATE_COLUMNS).where(WorkloadRow.state == PENDING)))


def states_of(store: Store, ids: Iterable[int]) -> dict[int, str]:
    """The state of each of the workloads ``ids`` that exist."""
    found: dict[int, str] = {}
    with store.session() as session:
        for chunk in chunks(sorted(set(ids))):
            query = select(WorkloadRow.id, WorkloadRow.state).where(WorkloadRow.id.in_(chunk))
            found.update((int(i), str(s)) for i, s in session.execute(query))
    return found


def running_per_array(store: Store, array_ids: Iterable[int]) -> dict[int, int]:
    """How many tasks of each of the arrays ``array_ids`` are running."""
    counts: dict[int, int] = {}
    with store.session() as session:
        for chunk in chunks(sorted(set(array_ids))):
            query = (
                select(WorkloadRow.array_id, func.count())
                .where(WorkloadRow.array_id.in_(chunk), WorkloadRow.state == RUNNING)
                .group_by(WorkloadRow.array_id)
            )
            counts.update((int(a or 0), int(n)) for a, n in session.execute(query))
    return counts


def array_tasks(store: Store, array_ids: Iterable[int]) -> dict[int, list[int]]:
    """The task ids of each of the arrays ``array_ids`` (an id that is no array's is left out)."""
    tasks: dict[int, list[int]] = {}
    with store.session() as session:
        for chunk in chunks(sorted(set(array_ids))):
            query = select(WorkloadRow.array_id, WorkloadRow.id).where(WorkloadRow.array_id.in_(chunk))
            for array_id, workload_id in session.execute(query.order_by(WorkloadRow.id)):
                tasks.setdefault(int(array_id or 0), []).append(int(workload_id))
    return tasks


def write_gates(
    store: Store, reasons: Sequence[tuple[int, str]], ends: Sequence[tuple[int, str]], now_s: float
) -> None:
    """The gate's decisions: why gated workloads wait, and those that can never run, ended cancelled with their
    reason (and an event). Each applies only while the workload is still pending and not being cancelled."""
    if not reasons and not ends:
        return
    still_pending = (WorkloadRow.state == PENDING) & ~WorkloadRow.cancel_requested
    with store.session() as session, session.begin():
        for workload_id, reason in reasons:
            query = update(WorkloadRow).where(WorkloadRow.id == workload_id, still_pending)
            session.execute(query.values(reason=reason))
        for workload_id, reason in ends:
            ended = session.execute(
                update(WorkloadRow)
                .where(WorkloadRow.id == workload_id, still_pending)
                .values(state=WorkloadState.CANCELLED.value, finished_at=now_s, reason=reason)
            )
            if getattr(ended, "rowcount", 0) == 1:
                session.add(EventRow(workload_id=workload_id, at=now_s, kind="cancelled", message=reason))


def copy_row(row: WorkloadRow, **changes: Any) -> WorkloadRow:
    """A new (unsaved) workload with ``row``'s columns but its id, and ``changes``: an array's next task."""
    table = WorkloadRow.__table__
    values = {column.key: getattr(row, column.key) for column in table.columns if column.key != "id"}
    values["command"], values["env"] = list(row.command), dict(row.env)
    return WorkloadRow(**{**values, **changes})
