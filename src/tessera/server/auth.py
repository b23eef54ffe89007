"""Bearer tokens: admins (every queue) and tenants (their own queues and workloads).

The secret is shown once, when it is created; the store keeps its HMAC-SHA256 under a key kept outside the database
(``token_key``: ``token.key`` in the data directory, mode 0600), so a copy of the database alone does not let anyone
test guesses. There is one admin token: the one the server was started with (``ensure_admin_token``); starting with
another one revokes the old. An admin token a person chose must be long and varied (``check_admin_token``).

The tenant ``default`` is reserved: it owns the default queue, where an admin's workloads go, so a tenant of that
name would see them as its own. No token is made for it, and a tenant token for it from an older server is refused.
"""

from __future__ import annotations

import logging
import os
import secrets
from pathlib import Path

from tessera.errors import InvalidRequestError
from tessera.server.records import unlimited_queue
from tessera.server.store.models import QueueRow, TokenRow
from tessera.server.store.store import AdminTokenConflict, Store
from tessera.server.submit import DEFAULT_QUEUE, Principal

log = logging.getLogger(__name__)

TOKEN_PREFIX = "tsr_"
TOKEN_KEY_FILE = "token.key"
MIN_ADMIN_TOKEN_CHARS = 24
MIN_ADMIN_TOKEN_DISTINCT = 10  # different characters: "aaaa...a" or "abab...ab" is long but guessable
RESERVED_TENANTS = frozenset({DEFAULT_QUEUE})
ADMIN_TOKEN_SOURCE = "TESSERA_ADMIN_TOKEN"  # how the admin token is given (or --admin-token-file), named in errors


def new_secret() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def token_key(data_dir: Path) -> bytes:
    """The server's token key, from ``data_dir/token.key`` (made on the first start: 32 random bytes, mode 0600).
    Losing the file invalidates every stored token: the admin token is stored again at the next start, tenant
    tokens must be created again."""
    path = data_dir / TOKEN_KEY_FILE
    data_dir.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        if path.stat().st_mode & 0o077:
            log.warning("%s was readable by others; made private (0600)", path)
            path.chmod(0o600)
    else:
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32) + "\n")
    text = path.read_text().strip()
    try:
        key = bytes.fromhex(text)
    except ValueError:
        key = b""
    if len(key) < 16:
        raise InvalidRequestError("--data-dir", f"{path} does not hold a token key (delete it to make a new one)")
    return key


def check_admin_token(secret: str, source: str = ADMIN_TOKEN_SOURCE) -> None:
    """Refuse an admin token that is short or made of few different characters."""
    if len(secret) < MIN_ADMIN_TOKEN_CHARS:
        raise InvalidRequestError(
            source,
            f"the admin token is too short ({len(secret)} characters; at least {MIN_ADMIN_TOKEN_CHARS}): "
            "make one with `python -c 'import secrets; print(secrets.token_urlsafe(32))'`",
        )
    if len(set(secret)) < MIN_ADMIN_TOKEN_DISTINCT:
        raise InvalidRequestError(
            source, f"the admin token is too easy to guess (fewer than {MIN_ADMIN_TOKEN_DISTINCT} different characters)"
        )


def ensure_admin_token(store: Store, given: str | None, now_s: float, source: str = ADMIN_TOKEN_SOURCE) -> str | None:
    """With ``given``: make it the one admin token (stored if new; every other admin token revoked). Without: keep
    the stored admin token, or create one on the first start. Returns the secret to print once, or None."""
    if given:
        check_admin_token(given, source)
        try:
            revoked = store.set_admin_token(given, "admin (given)", now_s)
        except AdminTokenConflict as exc:
            raise InvalidRequestError(source, str(exc)) from None
        if revoked:
            log.warning("a new admin token: %d earlier admin token(s) revoked", len(revoked))
        return None
    if store.has_admin_token():
        return None
    secret = new_secret()
    store.add_token(secret, None, True, "admin (generated)", now_s)
    return secret


def principal_for(store: Store, authorization: str | None, now_s: float | None = None) -> Principal | None:
    """Who the ``Authorization: Bearer ...`` header belongs to, or None (missing, malformed or unknown token)."""
    if not authorization:
        return None
    scheme, _, secret = authorization.partition(" ")
    if scheme.lower() != "bearer" or not secret.strip():
        return None
    row = store.token(secret.strip(), now_s)
    if row is None or (not row.is_admin and row.tenant in RESERVED_TENANTS):
        return None
    return Principal(row.tenant, row.is_admin)


def create_tenant_token(store: Store, tenant: str, label: str, now_s: float) -> tuple[str, QueueRow]:
    """A new token for ``tenant``. A tenant without a queue gets one without quota limits, named after it, or
    ``<tenant>-queue`` (``-2``, ...) when that name is taken: never another tenant's queue."""
    if tenant in RESERVED_TENANTS:
        raise InvalidRequestError("tenant", f"{tenant!r} is reserved: it owns the default queue, the admin's")
    queue = next((q for q in store.queues() if q.tenant == tenant), None)
    if queue is None:
        queue = _new_queue(store, tenant, now_s)
    secret = new_secret()
    store.add_token(secret, tenant, False, label, now_s)
    return secret, queue


def revoke_token(store: Store, token_id: int) -> TokenRow:
    """Revoke token ``token_id``; the last admin token cannot be (rotate it by starting the server with another)."""
    rows = store.tokens()
    row = next((r for r in rows if r.id == token_id), None)
    if row is None:
        raise LookupError(f"no token {token_id}")
    if row.is_admin and sum(r.is_admin for r in rows) == 1:
        raise InvalidRequestError(
            "token_id", "the last admin token cannot be revoked; start the server with a new admin token instead"
        )
    revoked = store.revoke_token(token_id)
    if revoked is None:
        raise LookupError(f"no token {token_id}")
    return revoked


def _new_queue(store: Store, tenant: str, now_s: float) -> QueueRow:
    for attempt in range(1, 101):
        suffix = "" if attempt == 1 else "-queue" if attempt == 2 else f"-queue-{attempt - 1}"
        name = tenant[: 100 - len(suffix)] + suffix  # a queue's name holds 100 characters
        added = store.add_queue(unlimited_queue(name, tenant, now_s))
        if added is not None:
            return added
    raise InvalidRequestError("tenant", f"no free queue name for tenant {tenant!r}; create its queue first")
