"""The newest event id a caller may know about: what ``GET /v1/events/stream`` polls to tell the dashboard that
something changed. Kept out of ``store.py`` (which is about workloads) like ``served.py``."""

from __future__ import annotations

from sqlalchemy import func, select

from tessera.server.store.models import EventRow, WorkloadRow
from tessera.server.store.store import Store


def latest_event_id(store: Store, tenant: str | None) -> int:
    """The id of the newest event (0 when there is none). With ``tenant``, only events of that tenant's workloads
    count: another tenant's activity (even the fact that there is some) is not its business."""
    query = select(func.max(EventRow.id))
    if tenant is not None:
        own = select(WorkloadRow.id).where(WorkloadRow.tenant == tenant)
        query = query.where(EventRow.workload_id.in_(own))
    with store.session() as session:
        return int(session.scalar(query) or 0)
