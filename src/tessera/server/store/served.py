"""The store's served models (``ServedModelRow``) and their replicas (workload rows carrying the model's id).

Used by the ``/v1/models`` routes and by ``server.serving_plane`` (the controller's view of the store). Kept out of
``store.py`` so that the workload store stays about workloads.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import get_args

from sqlalchemy import delete, func, select, update
from sqlalchemy.exc import IntegrityError

from tessera.api.serving import ModelState
from tessera.errors import InvalidRequestError
from tessera.server.store.models import EventRow, ServedModelRow, WorkloadRow
from tessera.server.store.store import ACTIVE_STATES, Store
from tessera.serving.replica_health import ModelHealth

Readiness = Callable[[int, int], bool]  # (workload id, attempt) -> whether the gateway serves that replica now


class ModelExistsError(InvalidRequestError):
    def __init__(self, name: str) -> None:
        super().__init__("name", f"a model named {name!r} is already deployed (names are shared by all tenants)")


def add_model(store: Store, row: ServedModelRow) -> ServedModelRow:
    try:
        with store.session() as session, session.begin():
            session.add(row)
    except IntegrityError:
        raise ModelExistsError(row.name) from None
    return row


def models(store: Store, tenant: str | None = None) -> list[ServedModelRow]:
    """Every model (``tenant`` None) or one tenant's, by name."""
    query = select(ServedModelRow).order_by(ServedModelRow.tenant, ServedModelRow.name)
    if tenant is not None:
        query = query.where(ServedModelRow.tenant == tenant)
    with store.session() as session:
        return list(session.scalars(query))


def model(store: Store, name: str) -> ServedModelRow | None:
    query = select(ServedModelRow).where(ServedModelRow.name == name)
    with store.session() as session:
        return session.scalars(query).first()


def active_replicas(store: Store, model_ids: list[int]) -> dict[int, list[WorkloadRow]]:
    """The pending and running replica workloads of each model, oldest first."""
    found: dict[int, list[WorkloadRow]] = {i: [] for i in model_ids}
    if not model_ids:
        return found
    query = (
        select(WorkloadRow)
        .where(WorkloadRow.model_id.in_(model_ids), WorkloadRow.state.in_(ACTIVE_STATES))
        .order_by(WorkloadRow.id)
    )
    with store.session() as session:
        for row in session.scalars(query):
            assert row.model_id is not None
            found[row.model_id].append(row)
    return found


MODEL_STATES: tuple[ModelState, ...] = get_args(ModelState)


def ready_replicas(replicas: list[WorkloadRow], readiness: Readiness | None = None) -> int:
    """Replicas whose engine answers: running, and proven by the gateway (``readiness``: (workload id, attempt) ->
    registered now) where there is one."""
    running = [r for r in replicas if r.state == "running" and not r.cancel_requested]
    if readiness is None:
        return len(running)
    return sum(readiness(r.id, r.attempts) for r in running)


def model_state(
    row: ServedModelRow,
    replicas: list[WorkloadRow],
    health: ModelHealth | None = None,
    readiness: Readiness | None = None,
) -> ModelState:
    """The lifecycle state of a model, from its row, its pending and running replicas (``active_replicas``), its
    health as the serving controller saw it last (``replica_health``) and which replicas the gateway serves now."""
    live = [r for r in replicas if not r.cancel_requested]
    if row.deleting:
        return "deleting"
    if ready_replicas(live, readiness):
        return "ready"
    if health is not None and health.failing:
        return "failing"
    if row.desired_replicas == 0 and not replicas:
        return "scaled-to-zero"  # and its GPU share is free: no replica is left, not even one stopping
    if row.desired_replicas == 0 and not live:
        return "stopping"
    return "deploying"


def evictions(store: Store, model_ids: list[int]) -> dict[int, int]:
    """How many times each model's replicas were preempted (evicted for a higher-priority workload), ever."""
    if not model_ids:
        return {}
    query = (
        select(WorkloadRow.model_id, func.count())
        .join(EventRow, EventRow.workload_id == WorkloadRow.id)
        .where(WorkloadRow.model_id.in_(model_ids), EventRow.kind == "preempted")
        .group_by(WorkloadRow.model_id)
    )
    with store.session() as session:
        return {int(model_id): int(n) for model_id, n in session.execute(query) if model_id is not None}


def set_desired(store: Store, model_id: int, desired: int) -> None:
    with store.session() as session, session.begin():
        session.execute(update(ServedModelRow).where(ServedModelRow.id == model_id).values(desired_replicas=desired))


def mark_deleting(store: Store, model_id: int) -> None:
    with store.session() as session, session.begin():
        session.execute(
            update(ServedModelRow).where(ServedModelRow.id == model_id).values(deleting=True, desired_replicas=0)
        )


def forget(store: Store, model_id: int) -> None:
    """Remove a deleted model whose replicas have all ended (their workload rows stay, as history)."""
    with store.session() as session, session.begin():
        session.execute(delete(ServedModelRow).where(ServedModelRow.id == model_id, ServedModelRow.deleting))
