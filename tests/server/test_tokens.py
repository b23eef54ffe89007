"""Tokens (issue 17, defect 6): a new admin token revokes the old one, a weak one is refused, tokens are listed
without secrets and revoked, and the store keeps only keyed hashes (HMAC-SHA256 under a key outside the database)."""

from __future__ import annotations

import hashlib
import stat
from pathlib import Path

import pytest
from server_harness import ADMIN, MakeHarness

from tessera.cli.gateway_up import TokenAuth
from tessera.errors import InvalidRequestError
from tessera.server.auth import TOKEN_KEY_FILE, ensure_admin_token, token_key
from tessera.server.store.db import open_engine
from tessera.server.store.store import Store

NEW_ADMIN = "a-new-admin-token-Kq83mZpX0v"


def test_starting_with_a_new_admin_token_revokes_the_old_one(make_harness: MakeHarness) -> None:
    h = make_harness()
    assert h.http.get("/v1/queues", headers=h.as_(ADMIN)).status_code == 200
    ensure_admin_token(h.server.ctx.store, NEW_ADMIN, h.clock())  # what `tessera up` does at start
    assert h.http.get("/v1/queues", headers=h.as_(ADMIN)).status_code == 401
    assert h.http.get("/v1/queues", headers=h.as_(NEW_ADMIN)).status_code == 200
    admins = [t for t in h.http.get("/v1/tokens", headers=h.as_(NEW_ADMIN)).json() if t["admin"]]
    assert len(admins) == 1
    ensure_admin_token(h.server.ctx.store, NEW_ADMIN, h.clock())  # the same one again: nothing changes
    assert h.http.get("/v1/queues", headers=h.as_(NEW_ADMIN)).status_code == 200


def test_a_generated_admin_token_is_revoked_once_one_is_given(tmp_path: Path) -> None:
    store = Store(open_engine(f"sqlite:///{tmp_path / 'store.db'}"), token_key(tmp_path))
    generated = ensure_admin_token(store, None, 1.0)
    assert generated is not None and store.token(generated) is not None
    assert ensure_admin_token(store, None, 2.0) is None  # kept across restarts without a token
    ensure_admin_token(store, NEW_ADMIN, 3.0)
    assert store.token(generated) is None
    assert [t.label for t in store.tokens() if t.is_admin] == ["admin (given)"]


@pytest.mark.parametrize(
    "weak",
    ["admin-secret", "short-but-varied-12", "a" * 40, "abababababababababababababab", "0123456789012345678901"],
)
def test_a_weak_admin_token_is_refused(tmp_path: Path, weak: str) -> None:
    store = Store(open_engine(f"sqlite:///{tmp_path / 'store.db'}"), token_key(tmp_path))
    with pytest.raises(InvalidRequestError) as refused:
        ensure_admin_token(store, weak, 1.0, source="TESSERA_ADMIN_TOKEN")
    assert refused.value.field == "TESSERA_ADMIN_TOKEN"
    assert not store.has_admin_token()


def test_a_tenants_token_cannot_become_the_admin_token(make_harness: MakeHarness) -> None:
    h = make_harness()
    tenant = h.http.post("/v1/tokens", json={"tenant": "team-a"}, headers=h.as_(ADMIN)).json()["token"]
    with pytest.raises(InvalidRequestError, match="tenant team-a"):
        ensure_admin_token(h.server.ctx.store, tenant, h.clock())
    assert h.http.get("/v1/queues", headers=h.as_(ADMIN)).status_code == 200  # the admin token is kept


def test_tokens_are_listed_without_secrets_and_revoked(make_harness: MakeHarness) -> None:
    h = make_harness()
    created = h.http.post("/v1/tokens", json={"tenant": "team-a", "label": "ci"}, headers=h.as_(ADMIN)).json()
    secret = created["token"]
    assert h.http.get("/v1/queues", headers=h.as_(secret)).status_code == 200
    listed = h.http.get("/v1/tokens", headers=h.as_(ADMIN))
    assert listed.status_code == 200
    assert secret not in listed.text and ADMIN not in listed.text
    rows = {t["tenant"]: t for t in listed.json()}
    assert set(rows) == {None, "team-a"}
    assert rows["team-a"]["label"] == "ci" and not rows["team-a"]["admin"] and rows[None]["admin"]
    assert rows["team-a"]["last_used_at"] == h.clock()  # used just above
    assert set(rows["team-a"]) == {"id", "tenant", "label", "admin", "created_at", "last_used_at"}

    assert h.http.get("/v1/tokens", headers=h.as_(secret)).status_code == 403
    assert h.http.delete(f"/v1/tokens/{rows[None]['id']}", headers=h.as_(secret)).status_code == 403
    revoked = h.http.delete(f"/v1/tokens/{rows['team-a']['id']}", headers=h.as_(ADMIN))
    assert revoked.status_code == 200 and revoked.json()["tenant"] == "team-a"
    assert h.http.get("/v1/queues", headers=h.as_(secret)).status_code == 401
    assert h.http.delete(f"/v1/tokens/{rows['team-a']['id']}", headers=h.as_(ADMIN)).status_code == 404
    last_admin = h.http.delete(f"/v1/tokens/{rows[None]['id']}", headers=h.as_(ADMIN))
    assert last_admin.status_code == 422 and last_admin.json()["field"] == "token_id", last_admin.text
    assert h.http.get("/v1/queues", headers=h.as_(ADMIN)).status_code == 200


def test_the_last_use_is_written_at_most_once_a_minute(make_harness: MakeHarness) -> None:
    h = make_harness()
    store = h.server.ctx.store
    first = h.clock()
    h.http.get("/v1/queues", headers=h.as_(ADMIN))
    h.clock.advance(30)
    h.http.get("/v1/queues", headers=h.as_(ADMIN))
    assert [t.last_used_at for t in store.tokens()] == [first]
    h.clock.advance(31)
    h.http.get("/v1/queues", headers=h.as_(ADMIN))
    assert [t.last_used_at for t in store.tokens()] == [first + 61]


def test_stored_hashes_are_keyed_by_a_private_key_outside_the_database(make_harness: MakeHarness) -> None:
    h = make_harness()
    data_dir = Path(h.server.ctx.loop.config.run_dir)
    key_file = data_dir / TOKEN_KEY_FILE
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    (row,) = h.server.ctx.store.tokens()
    assert row.token_hash != hashlib.sha256(ADMIN.encode()).hexdigest() and row.hash_scheme == "hmac-sha256"
    assert key_file.read_text().strip() not in str(h.server.ctx.store.meta("token_key"))
    other = Store(h.server.ctx.store.engine, b"another key, another hash")
    assert other.token(ADMIN) is None  # without the key, the database alone does not confirm a guess
    assert h.server.ctx.store.token(ADMIN) is not None


def test_a_token_key_file_readable_by_others_is_made_private(tmp_path: Path) -> None:
    key = token_key(tmp_path)
    (tmp_path / TOKEN_KEY_FILE).chmod(0o644)
    assert token_key(tmp_path) == key
    assert stat.S_IMODE((tmp_path / TOKEN_KEY_FILE).stat().st_mode) == 0o600


def test_a_revoked_token_stops_working_on_the_gateway_at_once(make_harness: MakeHarness) -> None:
    """The gateway caches who a token is (a stream of requests must not read the store each time); a revoked token
    once kept working there for the cache's 5 s. Revoking now drops the cache."""
    h = make_harness()
    secret = h.http.post("/v1/tokens", json={"tenant": "team-a"}, headers=h.as_(ADMIN)).json()["token"]
    auth = TokenAuth(h.server.ctx, ttl_s=3600)
    assert auth.tenant(secret) == "team-a"  # cached for an hour
    token_id = next(t["id"] for t in h.http.get("/v1/tokens", headers=h.as_(ADMIN)).json() if t["tenant"])
    assert h.http.delete(f"/v1/tokens/{token_id}", headers=h.as_(ADMIN)).status_code == 200
    assert auth.tenant(secret) is None
