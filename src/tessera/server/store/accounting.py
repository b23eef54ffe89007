"""Accounting and queue administration over the store: the workloads of a time window (``tessera history``, read
from the workload rows, which keep their times and placement after they end; no table of their own) and deleting a
queue, refused while work of it is pending or running, or a model deploys replicas into it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import delete, func, or_, select

from tessera.server.store.models import QueueRow, ServedModelRow, WorkloadRow
from tessera.server.store.store import ACTIVE_STATES, Store


def history_rows(
    store: Store,
    *,
    tenant: str | None = None,
    since: float | None = None,
    until: float | None = None,
    states: Sequence[str] = (),
    queue: str | None = None,
    after_id: int = 0,
    limit: int = 1000,
) -> list[WorkloadRow]:
    """Workloads whose life (submitted, to ended or still going) overlaps ``since``..``until``, by id."""
    query = select(WorkloadRow).where(WorkloadRow.id > after_id)
    if tenant is not None:
        query = query.where(WorkloadRow.tenant == tenant)
    if until is not None:
        query = query.where(WorkloadRow.submitted_at <= until)
    if since is not None:
        query = query.where(or_(WorkloadRow.finished_at.is_(None), WorkloadRow.finished_at >= since))
    if states:
        query = query.where(WorkloadRow.state.in_(list(states)))
    if queue is not None:
        query = query.where(WorkloadRow.queue == queue)
    with store.session() as session:
        return list(session.scalars(query.order_by(WorkloadRow.id).limit(limit)))


@dataclass(frozen=True, slots=True)
class QueueInUse:
    """Why a queue cannot be deleted now."""

    pending: int
    running: int
    models: tuple[str, ...]


def delete_queue(store: Store, name: str) -> QueueRow | QueueInUse | None:
    """Delete queue ``name`` in one transaction: the row deleted, or ``QueueInUse`` (nothing changed) while
    workloads wait or run in it or a model deploys into it, or None when there is no such queue. Ended workloads
    keep the queue's name in their records (history still shows it)."""
    with store.session() as session, session.begin():
        row = session.get(QueueRow, name)
        if row is None:
            return None
        counts = dict(
            session.execute(
                select(WorkloadRow.state, func.count())
                .where(WorkloadRow.queue == name, WorkloadRow.state.in_(ACTIVE_STATES))
                .group_by(WorkloadRow.state)
            ).all()
        )
        models = tuple(session.scalars(select(ServedModelRow.name).where(ServedModelRow.queue == name)))
        if counts or models:
            pending, running = ACTIVE_STATES
            return QueueInUse(counts.get(pending, 0), counts.get(running, 0), models)
        session.execute(delete(QueueRow).where(QueueRow.name == name))
        session.expunge(row)
        return row
