"""``Store``: every read and write of the control plane's state, one short transaction per call.

The API threads and the scheduler loop share one ``Store``; SQLite (WAL) and PostgreSQL both serialise the writers.
Rows come back detached (``expire_on_commit=False``): read them freely, change them only through ``Store`` methods;
the scheduler loop's changes arrive as typed values (``store.changes``) that the store turns into column values.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, Row, Table, func, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from tessera.core.workload import WorkloadState
from tessera.faults import crash_point, fail_point
from tessera.server.store.bulk import chunks, write_changes
from tessera.server.store.changes import (
    BindChange,
    EndChange,
    ReasonChange,
    RequeueChange,
    WorkloadChange,
    columns_of,
)
from tessera.server.store.models import EventRow, MetaRow, QueueRow, TokenRow, WorkloadRow

PENDING = WorkloadState.PENDING.value
RUNNING = WorkloadState.RUNNING.value
ACTIVE_STATES = (PENDING, RUNNING)
TERMINAL_STATES = tuple(s.value for s in WorkloadState if s.value not in ACTIVE_STATES)
WORKLOADS: Table = WorkloadRow.__table__  # type: ignore[assignment]  # a declarative class's Table
EVENTS: Table = EventRow.__table__  # type: ignore[assignment]
REQUEST_COLUMNS = (
    WorkloadRow.id,
    WorkloadRow.num_gpus,
    WorkloadRow.gpu_milli,
    WorkloadRow.gpu_mem_mib,
    WorkloadRow.gpu_types,
    WorkloadRow.cpu_milli,
    WorkloadRow.mem_mib,
    WorkloadRow.priority,
    WorkloadRow.queue,
    WorkloadRow.preemptible,
    WorkloadRow.submitted_at,
    WorkloadRow.workers,
    WorkloadRow.elastic_min,
    WorkloadRow.elastic_max,
    WorkloadRow.job_type,
    WorkloadRow.checkpointable,
)

PendingRow = Row[Any]  # the REQUEST_COLUMNS of one pending workload (``Store.pending_requests``)
KEYED = "hmac-sha256"  # TokenRow.hash_scheme of a keyed hash
LEGACY = "sha256"  # ... of a plain SHA-256 stored before revision 0003
LAST_USED_RESOLUTION_S = 60.0  # a token's last use is written at most once a minute: not one write per request
TOKEN_KEY_META = "token_key"  # where the key is kept when the store is given none (tests, tools)


def hash_token(secret: str) -> str:
    """The plain SHA-256 that servers before revision 0003 stored (read only, to rehash old rows)."""
    return hashlib.sha256(secret.encode("utf-8", "surrogatepass")).hexdigest()


class AdminTokenConflict(Exception):
    """The admin token given is already a tenant's token."""


@dataclass(frozen=True, slots=True)
class Event:
    workload_id: int | None
    kind: str
    message: str


class Store:
    """``token_key``: the secret key of the tokens' HMACs, kept outside the database (``tessera up`` keeps it in
    its data directory) so that a copy of the database alone does not allow testing guesses of a token. Without
    one, the store keeps a key in its own ``meta`` table: keyed, but beside the hashes."""

    def __init__(self, engine: Engine, token_key: bytes | None = None) -> None:
        self.engine = engine
        self._sessions = sessionmaker(engine, expire_on_commit=False)
        self._token_key = token_key
        # Bumped after every revocation this process makes: a cache of who a token is (the gateway's) drops its
        # answers when it changes, so a revoked token stops working at once there too.
        self.revocations = 0

    def session(self) -> Session:
        return self._sessions()

    # ------------------------------------------------------------------------------------------------ workloads

    def add_workload(self, row: WorkloadRow, now_s: float) -> WorkloadRow:
        with self._sessions.begin() as session:
            session.add(row)
            session.flush()
            session.add(EventRow(workload_id=row.id, at=now_s, kind="submitted", message=_submitted(row)))
        return row

    def get_workload(self, workload_id: int) -> WorkloadRow | None:
        with self.session() as session:
            return session.get(WorkloadRow, workload_id)

    def list_workloads(
        self,
        *,
        tenant: str | None = None,
        states: Sequence[str] = (),
        queue: str | None = None,
        limit: int = 1000,
        after_id: int = 0,
        name: str | None = None,
        array_id: int | None = None,
    ) -> list[WorkloadRow]:
        query = select(WorkloadRow).where(WorkloadRow.id > after_id).order_by(WorkloadRow.id).limit(limit)
        if tenant is not None:
            query = query.where(WorkloadRow.tenant == tenant)
        if name is not None:
            query = query.where(WorkloadRow.name == name)
        if array_id is not None:
            query = query.where(WorkloadRow.array_id == array_id)
        if states:
            query = query.where(WorkloadRow.state.in_(states))
        if queue is not None:
            query = query.where(WorkloadRow.queue == queue)
        with self.session() as session:
            return list(session.scalars(query))

    def workloads_in(self, states: Sequence[str]) -> list[WorkloadRow]:
        with self.session() as session:
            return list(session.scalars(select(WorkloadRow).where(WorkloadRow.state.in_(states))))

    def ids_in(self, state: str) -> list[int]:
        with self.session() as session:
            return list(session.scalars(select(WorkloadRow.id).where(WorkloadRow.state == state)))

    def cancel_requested_ids(self) -> list[int]:
        query = select(WorkloadRow.id).where(WorkloadRow.state == RUNNING, WorkloadRow.cancel_requested)
        with self.session() as session:
            return list(session.scalars(query))

    def workloads_by_id(self, ids: Iterable[int]) -> list[WorkloadRow]:
        rows: list[WorkloadRow] = []
        with self.session() as session:
            for chunk in chunks(list(ids)):
                rows.extend(session.scalars(select(WorkloadRow).where(WorkloadRow.id.in_(chunk))))
        return rows

    def tenants_of(self, ids: Iterable[int]) -> dict[int, str]:
        """The tenant of each of the workloads ``ids`` (those that exist)."""
        found: dict[int, str] = {}
        with self.session() as session:
            for chunk in chunks(list(ids)):
                query = select(WorkloadRow.id, WorkloadRow.tenant).where(WorkloadRow.id.in_(chunk))
                found.update((int(i), str(t)) for i, t in session.execute(query))
        return found

    def pending_requests(self, ids: Iterable[int]) -> list[PendingRow]:
        """Just what the scheduler needs of workloads ``ids`` that are still pending (request, priority, queue,
        submission time): far cheaper than whole rows when thousands wait. Columns named as in ``WorkloadRow``."""
        query = select(*REQUEST_COLUMNS).where(WorkloadRow.state == PENDING)
        rows: list[Row[Any]] = []
        with self.session() as session:
            for chunk in chunks(list(ids)):
                rows.extend(session.execute(query.where(WorkloadRow.id.in_(chunk))))
        return rows

    def update_workloads(self, changes: Sequence[WorkloadChange], events: Sequence[Event], now_s: float) -> None:
        """Apply ``changes`` (in order: a later change of a row wins) and record ``events``, atomically."""
        if any(isinstance(change, EndChange) for change in changes):
            crash_point("before-end")  # fault injection (tessera.faults); a no-op unless TESSERA_CRASH_AT says so
        if any(isinstance(change, EndChange | RequeueChange) for change in changes):
            fail_point("end-write", "the store failed")  # fault injection: a no-op unless TESSERA_FAIL_AT says so
        with self._sessions.begin() as session:
            write_changes(session, [columns_of(change) for change in changes])
            _insert_events(session, events, now_s)

    def commit_decisions(
        self,
        binds: Sequence[BindChange],
        reasons: Sequence[ReasonChange],
        changes: Sequence[WorkloadChange],
        events: Sequence[Event],
        now_s: float,
    ) -> set[int]:
        """One step's decisions in one transaction. ``binds`` and ``reasons`` (why a workload waits) apply only to
        workloads still pending and not being cancelled: a cancel that came in while the step was planning wins.
        Returns the ids of binds that lost that race (their events are not recorded)."""
        if binds:
            fail_point("decisions-write", "the store failed")  # fault injection: nothing is written
        with self._sessions.begin() as session:
            write_changes(session, [columns_of(bind) for bind in binds], only_pending=True)
            if binds:
                crash_point("mid-commit")  # fault injection: the binds are written, nothing is committed
            ids = [bind.workload_id for bind in binds]
            taken: set[int] = set()
            for chunk in chunks(ids):
                query = select(WORKLOADS.c.id).where(WORKLOADS.c.id.in_(chunk), WORKLOADS.c.state == RUNNING)
                taken.update(session.scalars(query))
            lost = set(ids) - taken
            write_changes(session, [columns_of(reason) for reason in reasons], only_pending=True)
            write_changes(session, [columns_of(change) for change in changes])
            _insert_events(session, [e for e in events if e.workload_id not in lost or e.kind != "bound"], now_s)
        return lost

    def request_cancel(self, workload_id: int, now_s: float) -> WorkloadRow | None:
        """Cancel: a pending workload ends at once; a running one is flagged for the loop to stop."""
        with self._sessions.begin() as session:
            row = session.get(WorkloadRow, workload_id, with_for_update=True)
            if row is None or row.state in TERMINAL_STATES:
                return row
            if row.state == PENDING:
                row.state = WorkloadState.CANCELLED.value
                row.finished_at = now_s
                row.reason = "cancelled while pending"
                session.add(EventRow(workload_id=row.id, at=now_s, kind="cancelled", message=row.reason))
            elif not row.cancel_requested:
                row.cancel_requested = True
                session.add(EventRow(workload_id=row.id, at=now_s, kind="cancel-requested", message="stopping"))
            return row

    def count_by_state_and_queue(self) -> list[tuple[str, str, int]]:
        query = select(WorkloadRow.state, WorkloadRow.queue, func.count()).group_by(
            WorkloadRow.state, WorkloadRow.queue
        )
        with self.session() as session:
            return [(s, q, int(n)) for s, q, n in session.execute(query)]

    # ------------------------------------------------------------------------------------------------- events

    def events(self, workload_id: int | None = None, limit: int = 200) -> list[EventRow]:
        query = select(EventRow).order_by(EventRow.id.desc()).limit(limit)
        if workload_id is not None:
            query = query.where(EventRow.workload_id == workload_id)
        with self.session() as session:
            return list(reversed(list(session.scalars(query))))

    # ------------------------------------------------------------------------------------------------- tokens

    def add_token(self, secret: str, tenant: str | None, is_admin: bool, label: str, now_s: float) -> TokenRow:
        row = self._token_row(secret, tenant, is_admin, label, now_s)
        with self._sessions.begin() as session:
            session.add(row)
        return row

    def token(self, secret: str, now_s: float | None = None) -> TokenRow | None:
        """The token whose secret is ``secret``, or None: one indexed lookup of its keyed hash, then (for a row stored
        before revision 0003) of its plain SHA-256, which is then replaced by the keyed hash. With ``now_s``, the
        token's last use is recorded if the one recorded is over a minute old."""
        keyed = self._keyed(secret)
        with self.session() as session:
            row = session.scalars(select(TokenRow).where(TokenRow.token_hash == keyed)).first()
        if row is None:
            row = self._rehash(secret, keyed)
        if row is not None and now_s is not None and now_s - (row.last_used_at or 0.0) >= LAST_USED_RESOLUTION_S:
            with self._sessions.begin() as session:
                session.execute(update(TokenRow).where(TokenRow.id == row.id).values(last_used_at=now_s))
            row.last_used_at = now_s
        return row

    def tokens(self) -> list[TokenRow]:
        with self.session() as session:
            return list(session.scalars(select(TokenRow).order_by(TokenRow.id)))

    def revoke_token(self, token_id: int) -> TokenRow | None:
        """Delete token ``token_id``; returns its row, or None when there is none."""
        with self._sessions.begin() as session:
            row = session.get(TokenRow, token_id, with_for_update=True)
            if row is not None:
                session.delete(row)
        self.revocations += 1
        return row

    def set_admin_token(self, secret: str, label: str, now_s: float) -> list[TokenRow]:
        """Make ``secret`` the one admin token: stored if new, and every other admin token revoked, atomically.
        Returns the revoked rows. Raises ``AdminTokenConflict`` when ``secret`` is a tenant's token."""
        self.token(secret)  # a row of an older server is rehashed first, so that it is found below
        keyed = self._keyed(secret)
        with self._sessions.begin() as session:
            same = session.scalars(select(TokenRow).where(TokenRow.token_hash == keyed)).first()
            if same is not None and not same.is_admin:
                raise AdminTokenConflict(f"the admin token is tenant {same.tenant}'s token (id {same.id})")
            others = list(session.scalars(select(TokenRow).where(TokenRow.is_admin, TokenRow.token_hash != keyed)))
            for row in others:
                session.delete(row)
            if same is None:
                session.add(self._token_row(secret, None, True, label, now_s))
        self.revocations += 1
        return others

    def has_admin_token(self) -> bool:
        with self.session() as session:
            return session.scalars(select(TokenRow.id).where(TokenRow.is_admin)).first() is not None

    def _token_row(self, secret: str, tenant: str | None, is_admin: bool, label: str, now_s: float) -> TokenRow:
        return TokenRow(
            token_hash=self._keyed(secret),
            hash_scheme=KEYED,
            tenant=tenant,
            is_admin=is_admin,
            label=label,
            created_at=now_s,
        )

    def _rehash(self, secret: str, keyed: str) -> TokenRow | None:
        """The row of an older server that stored ``secret``'s plain SHA-256, now rehashed; None if there is none."""
        with self._sessions.begin() as session:
            query = select(TokenRow).where(TokenRow.token_hash == hash_token(secret), TokenRow.hash_scheme == LEGACY)
            row = session.scalars(query).first()
            if row is not None:
                row.token_hash = keyed
                row.hash_scheme = KEYED
            return row

    def _keyed(self, secret: str) -> str:
        return hmac.new(self._key(), secret.encode("utf-8", "surrogatepass"), hashlib.sha256).hexdigest()

    def _key(self) -> bytes:
        if self._token_key is None:
            stored = self.meta(TOKEN_KEY_META)
            if stored is None:
                try:
                    with self._sessions.begin() as session:
                        session.add(MetaRow(key=TOKEN_KEY_META, value=secrets.token_hex(32)))
                except IntegrityError:
                    pass  # another store made it first: use that one
                stored = self.meta(TOKEN_KEY_META)
            self._token_key = bytes.fromhex(stored)
        return self._token_key

    # ------------------------------------------------------------------------------------------------- queues

    def queues(self) -> list[QueueRow]:
        with self.session() as session:
            return list(session.scalars(select(QueueRow).order_by(QueueRow.name)))

    def queue(self, name: str) -> QueueRow | None:
        with self.session() as session:
            return session.get(QueueRow, name)

    def put_queue(self, row: QueueRow) -> QueueRow:
        with self._sessions.begin() as session:
            return session.merge(row)

    def add_queue(self, row: QueueRow) -> QueueRow | None:
        """Insert ``row``; None (and nothing changed) when a queue of that name exists."""
        try:
            with self._sessions.begin() as session:
                session.add(row)
        except IntegrityError:
            return None
        return row

    # --------------------------------------------------------------------------------------------------- meta

    def meta(self, key: str) -> Any:
        with self.session() as session:
            row = session.get(MetaRow, key)
            return None if row is None else row.value

    def set_meta(self, key: str, value: Any) -> None:
        with self._sessions.begin() as session:
            session.merge(MetaRow(key=key, value=value))


def _insert_events(session: Session, events: Sequence[Event], now_s: float) -> None:
    if events:
        rows = [{"workload_id": e.workload_id, "at": now_s, "kind": e.kind, "message": e.message} for e in events]
        session.execute(insert(EVENTS), rows)


def _submitted(row: WorkloadRow) -> str:
    return f"submitted to queue {row.queue} by tenant {row.tenant}"
