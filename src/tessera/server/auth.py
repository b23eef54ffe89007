"""Bearer tokens: admins (every queue) and tenants (their own queues and workloads). Only a token's SHA-256 is
stored; the secret is shown once, when it is created."""

from __future__ import annotations

import secrets

from tessera.server.records import unlimited_queue
from tessera.server.store.models import QueueRow
from tessera.server.store.store import Store
from tessera.server.submit import Principal

TOKEN_PREFIX = "tsr_"


def new_secret() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def principal_for(store: Store, authorization: str | None) -> Principal | None:
    """Who the ``Authorization: Bearer ...`` header belongs to, or None (missing, malformed or unknown token)."""
    if not authorization:
        return None
    scheme, _, secret = authorization.partition(" ")
    if scheme.lower() != "bearer" or not secret.strip():
        return None
    row = store.token(secret.strip())
    if row is None:
        return None
    return Principal(row.tenant, row.is_admin)


def create_tenant_token(store: Store, tenant: str, label: str, now_s: float) -> tuple[str, QueueRow]:
    """A new token for ``tenant``; the tenant gets a queue of its own name (no quota limit) if it has none."""
    queue = next((q for q in store.queues() if q.tenant == tenant), None)
    if queue is None:
        existing = store.queue(tenant)
        name = tenant if existing is None else f"{tenant}-queue"
        queue = store.put_queue(unlimited_queue(name, tenant, now_s))
    secret = new_secret()
    store.add_token(secret, tenant, False, label, now_s)
    return secret, queue
