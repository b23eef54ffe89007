"""Bulk writes of the workloads table: a step of the scheduler loop can write thousands of decisions, so changes
that set the same columns are written with Core statements (one ``UPDATE ... WHERE id IN (...)`` per shared value,
one executemany for the rest), not through the ORM row by row. Used by ``store.Store`` only."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from itertools import groupby
from typing import Any

from sqlalchemy import Table, bindparam, true, update
from sqlalchemy.orm import Session

from tessera.core.workload import WorkloadState
from tessera.server.store.models import WorkloadRow

PENDING = WorkloadState.PENDING.value
WORKLOADS: Table = WorkloadRow.__table__  # type: ignore[assignment]  # a declarative class's Table
IN_LIST_MAX = 500  # ids per IN (...) list


def columns_key(change: Mapping[str, Any]) -> tuple[str, ...]:
    return tuple(change)


def chunks(ids: Sequence[int]) -> Iterator[Sequence[int]]:
    """``ids`` in slices short enough for an ``IN (...)`` list on every database."""
    for start in range(0, len(ids), IN_LIST_MAX):
        yield ids[start : start + IN_LIST_MAX]


def write_changes(session: Session, changes: Sequence[Mapping[str, Any]], *, only_pending: bool = False) -> None:
    """Core statements per run of changes that set the same columns: a step can write thousands of decisions, and
    the ORM's bulk paths cost more per row than the database does."""
    for columns, run in groupby(changes, key=columns_key):
        unknown = set(columns) - set(WORKLOADS.c.keys())
        if unknown or columns == ("id",):
            raise KeyError(f"workload change with unknown or no columns: {sorted(unknown) or columns}")
        update_run(session, [c for c in columns if c != "id"], list(run), only_pending=only_pending)


def update_run(
    session: Session, columns: list[str], run: list[Mapping[str, Any]], *, only_pending: bool = False
) -> None:
    """Workloads that get the same values (the reason thousands wait, say) get one ``UPDATE ... WHERE id IN (...)``
    per value; the others one executemany, row by row. ``only_pending``: rows no longer pending, being
    cancelled or held (``tessera hold`` between a step's plan and its commit) are left alone."""
    shared = ids_by_values(columns, run)
    grouped = {workload_id for ids in shared.values() for workload_id in ids}
    singles = [change for change in run if change["id"] not in grouped]
    still_pending = (
        (WORKLOADS.c.state == PENDING) & ~WORKLOADS.c.cancel_requested & ~WORKLOADS.c.held if only_pending else true()
    )
    if singles:
        statement = update(WORKLOADS).where(WORKLOADS.c.id == bindparam("id_"), still_pending)
        session.execute(statement, [{"id_": change["id"], **{c: change[c] for c in columns}} for change in singles])
    for values, ids in shared.items():
        assignments = dict(zip(columns, values, strict=True))
        for chunk in chunks(ids):
            session.execute(update(WORKLOADS).where(WORKLOADS.c.id.in_(chunk), still_pending).values(assignments))


def ids_by_values(columns: list[str], run: list[Mapping[str, Any]]) -> dict[tuple[Any, ...], list[int]]:
    """The ids of ``run`` by the values they get, for values shared by several; {} when the changes cannot be
    grouped (a value that cannot be hashed, such as a placement, or the same workload twice: its order counts)."""
    by_values: dict[tuple[Any, ...], list[int]] = defaultdict(list)
    try:
        for change in run:
            by_values[tuple(change[c] for c in columns)].append(change["id"])
    except TypeError:
        return {}
    if len({change["id"] for change in run}) < len(run):
        return {}
    return {values: ids for values, ids in by_values.items() if len(ids) > 1}
