"""Events counted by kind and queue, for the lifecycle counters of ``/metrics`` (``server.metrics_workloads``).

The counters are read from the event log rather than kept by the code paths that write it, so they cover every
writer (the API's submissions, the loop's starts, preemptions and ends) and survive a restart. Reading grows with
the events written since the last read, not with the whole history: the caller keeps what is settled (events older
than a few seconds, which no late transaction can add to) and recounts only the recent tail.
"""

from __future__ import annotations

from collections.abc import Collection

from sqlalchemy import func, select

from tessera.server.store.models import EventRow, WorkloadRow
from tessera.server.store.store import Store


def event_counts(
    store: Store, kinds: Collection[str], after_id: int, up_to_id: int | None = None
) -> dict[tuple[str, str], int]:
    """(kind, queue) -> how many events of ``kinds`` have an id in (``after_id``, ``up_to_id``]; events of no
    workload are left out."""
    query = (
        select(EventRow.kind, WorkloadRow.queue, func.count())
        .join(WorkloadRow, WorkloadRow.id == EventRow.workload_id)
        .where(EventRow.id > after_id, EventRow.kind.in_(list(kinds)))
        .group_by(EventRow.kind, WorkloadRow.queue)
    )
    if up_to_id is not None:
        query = query.where(EventRow.id <= up_to_id)
    with store.session() as session:
        return {(kind, queue): int(n) for kind, queue, n in session.execute(query)}


def settled_event_id(store: Store, after_id: int, before_s: float) -> int:
    """The newest event id after ``after_id`` written before ``before_s`` (``after_id`` when there is none): every
    event up to it is committed, so it can be counted once and for all."""
    query = select(func.max(EventRow.id)).where(EventRow.id > after_id, EventRow.at <= before_s)
    with store.session() as session:
        newest = session.scalar(query)
    return after_id if newest is None else int(newest)
