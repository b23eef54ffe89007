"""Store migrations keep what an older server stored: a store made at revision 0001 (pid, pgid, start marker and
exit file in four columns) opens with the new code, and its running workloads keep a handle the local backend
re-adopts (on SQLite and on PostgreSQL when ``make test`` runs one); a token stored as a plain SHA-256 before
revision 0003 keeps working and is rehashed under the server's key."""

from __future__ import annotations

import hashlib
import hmac
from pathlib import Path

import pytest
from sqlalchemy import text

from tessera.backends.base import Handle
from tessera.server.gates import Gate
from tessera.server.store.db import downgrade, open_engine, upgrade
from tessera.server.store.store import Store

INSERT_0001 = text(
    "INSERT INTO workloads (id, name, tenant, queue, kind, state, priority, priority_class, preemptible, num_gpus,"
    " gpu_milli, gpu_mem_mib, gpu_types, cpu_milli, mem_mib, command, env, submitted_at, reason, attempts,"
    " cancel_requested, log_path, pid, pgid, started_marker, exit_file)"
    " VALUES (:id, 'w', 't', 'default', 'batch', :state, 0, '', :yes, 1, 500, 0, '', 1000, 64, '[\"sleep\"]', '{}',"
    " 1.0, '', 1, :no, '', :pid, :pgid, :marker, :exit_file)"
)


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'store.db'}"
    return str(request.getfixturevalue("postgres_url"))


def _old_store(db_url: str) -> None:
    engine = open_engine(db_url, migrate=False)
    upgrade(engine, "0001")
    rows = [
        {"id": 1, "state": "running", "pid": 4242, "pgid": 4242, "marker": "987654", "exit_file": "/run/1.exit"},
        {"id": 2, "state": "running", "pid": None, "pgid": None, "marker": None, "exit_file": None},  # not launched
        {"id": 3, "state": "succeeded", "pid": 77, "pgid": 77, "marker": "5", "exit_file": "/run/3.exit"},
        {"id": 4, "state": "running", "pid": 88, "pgid": None, "marker": "6", "exit_file": "/run/4.exit"},  # partial
    ]
    with engine.begin() as connection:
        connection.execute(INSERT_0001, [{**row, "yes": True, "no": False} for row in rows])
        connection.execute(text("INSERT INTO events (workload_id, at, kind, message) VALUES (1, 1.0, 'started', '')"))
    engine.dispose()


def test_a_store_of_revision_0001_keeps_its_running_workloads_adoptable(db_url: str) -> None:
    _old_store(db_url)
    store = Store(open_engine(db_url))  # migrates to the newest revision
    rows = {row.id: row for row in store.workloads_by_id([1, 2, 3, 4])}
    assert Handle.from_json(rows[1].handle) == Handle(
        "1", "local", {"pid": 4242, "pgid": 4242, "started_marker": "987654", "exit_file": "/run/1.exit"}
    )
    assert Handle.from_json(rows[3].handle).data["pid"] == 77  # ended rows convert too (the handle is inert)
    assert rows[2].handle is None and rows[4].handle is None  # what the old code could not adopt either
    assert [event.kind for event in store.events(1)] == ["started"]  # the batch copy kept the events' rows
    with store.engine.connect() as connection:
        columns = set(connection.execute(text("SELECT * FROM workloads")).keys())
    assert "handle" in columns and not columns & {"pid", "pgid", "started_marker", "exit_file"}


def test_downgrade_to_0001_puts_local_handles_back_into_the_four_columns(db_url: str) -> None:
    _old_store(db_url)
    engine = open_engine(db_url)
    downgrade(engine, "0001")
    with engine.connect() as connection:
        got = connection.execute(text("SELECT id, pid, pgid, started_marker, exit_file FROM workloads ORDER BY id"))
        assert [tuple(row) for row in got] == [
            (1, 4242, 4242, "987654", "/run/1.exit"),
            (2, None, None, None, None),
            (3, 77, 77, "5", "/run/3.exit"),
            (4, None, None, None, None),
        ]


def test_a_token_stored_as_plain_sha256_still_works_and_is_rehashed_under_the_key(db_url: str) -> None:
    engine = open_engine(db_url, migrate=False)
    upgrade(engine, "0002")
    secret = "tsr_made-by-an-older-server"
    with engine.begin() as connection:
        connection.execute(
            text("INSERT INTO tokens (token_hash, tenant, is_admin, label, created_at) VALUES (:h, 't', :no, '', 1.0)"),
            {"h": hashlib.sha256(secret.encode()).hexdigest(), "no": False},
        )
    engine.dispose()
    store = Store(open_engine(db_url), b"the server's token key")
    (old,) = store.tokens()
    assert old.hash_scheme == "sha256"
    found = store.token(secret)
    assert found is not None and found.tenant == "t"
    (rehashed,) = store.tokens()
    assert rehashed.hash_scheme == "hmac-sha256"
    assert rehashed.token_hash == hmac.new(b"the server's token key", secret.encode(), hashlib.sha256).hexdigest()
    assert store.token(secret) is not None and store.token("tsr_wrong") is None
    downgrade(store.engine, "0002")  # keyed rows cannot go back to plain hashes: dropped
    with store.engine.connect() as connection:
        assert connection.execute(text("SELECT COUNT(*) FROM tokens")).scalar_one() == 0


def test_revision_0004_adds_served_models_and_leaves_older_workloads_nobodys_replicas(db_url: str) -> None:
    _old_store(db_url)
    engine = open_engine(db_url, migrate=False)
    upgrade(engine, "0003")
    engine.dispose()
    store = Store(open_engine(db_url))  # 0003 -> newest
    assert all(row.model_id is None for row in store.workloads_by_id([1, 2, 3, 4]))
    with store.engine.connect() as connection:
        assert connection.execute(text("SELECT COUNT(*) FROM served_models")).scalar() == 0
    downgrade(store.engine, "0003")
    with store.engine.connect() as connection:
        columns = set(connection.execute(text("SELECT * FROM workloads")).keys())
    assert "model_id" not in columns and "handle" in columns


def test_revision_0005_gives_older_workloads_no_job_options_and_schedules_them_as_before(db_url: str) -> None:
    _old_store(db_url)
    engine = open_engine(db_url, migrate=False)
    upgrade(engine, "0004")
    engine.dispose()
    store = Store(open_engine(db_url))  # 0004 -> newest
    for row in store.workloads_by_id([1, 2, 3, 4]):
        assert (row.cwd, row.time_limit_s, row.held, row.dependency, row.array_id) == (None, None, False, None, None)
    with store.engine.begin() as connection:  # a pending workload of the old server: the gate lets it through
        connection.execute(text("UPDATE workloads SET state = 'pending' WHERE id = 2"))
    assert Gate(store).eligible(2.0) == {2}
    downgrade(store.engine, "0004")
    with store.engine.connect() as connection:
        columns = set(connection.execute(text("SELECT * FROM workloads")).keys())
    assert not columns & {"cwd", "time_limit_s", "held", "dependency", "array_id", "array_index", "array_limit"}
    assert "model_id" in columns


def test_revision_0006_gives_older_workloads_one_rigid_worker_of_no_job_type(db_url: str) -> None:
    """... checkpointable as the scheduler took them before: when their priority class made them preemptible."""
    _old_store(db_url)
    engine = open_engine(db_url, migrate=False)
    upgrade(engine, "0005")
    engine.dispose()
    store = Store(open_engine(db_url))  # 0005 -> newest
    for row in store.workloads_by_id([1, 2, 3, 4]):
        assert (row.workers, row.elastic_min, row.elastic_max, row.job_type, row.checkpointable) == (
            1,
            None,
            None,
            "",
            row.preemptible,
        )
    downgrade(store.engine, "0005")
    with store.engine.connect() as connection:
        columns = set(connection.execute(text("SELECT * FROM workloads")).keys())
    assert not columns & {"workers", "elastic_min", "elastic_max", "job_type", "checkpointable", "settled_at"}
    assert "array_id" in columns


def test_revision_0007_keeps_older_models_on_least_load(db_url: str) -> None:
    engine = open_engine(db_url, migrate=False)
    upgrade(engine, "0006")
    with engine.begin() as connection:
        connection.execute(
            text(
                "INSERT INTO served_models (name, tenant, queue, engine, weights, num_gpus, gpu_milli, gpu_mem_mib,"
                " min_replicas, max_replicas, idle_timeout_s, slo, desired_replicas, deleting, created_at)"
                " VALUES ('old', 't', 'default', 'sim', '', 1, 250, 0, 1, 1, 30.0, 'standard', 1, :no, 1.0)"
            ),
            {"no": False},
        )
    engine.dispose()
    store = Store(open_engine(db_url))  # 0006 -> newest
    with store.engine.connect() as connection:
        assert connection.execute(text("SELECT router FROM served_models")).scalar_one() == "least-load"
    downgrade(store.engine, "0006")
    with store.engine.connect() as connection:
        assert "router" not in set(connection.execute(text("SELECT * FROM served_models")).keys())


def test_revision_0008_lets_a_model_follow_the_setup_and_keeps_what_older_ones_had(db_url: str) -> None:
    store = Store(open_engine(db_url))  # newest
    with store.engine.begin() as connection:
        connection.execute(
            text(
                "INSERT INTO served_models (name, tenant, queue, engine, weights, num_gpus, gpu_milli, gpu_mem_mib,"
                " min_replicas, max_replicas, idle_timeout_s, slo, router, desired_replicas, deleting, created_at)"
                " VALUES ('new', 't', 'default', 'sim', '', 1, 250, 0, 1, 1, 30.0, 'standard', NULL, 1, :no, 1.0)"
            ),
            {"no": False},
        )
    with store.engine.connect() as connection:
        row = connection.execute(text("SELECT router, autoscaler FROM served_models")).one()
    assert tuple(row) == (None, None)  # both the server's serving setup's
    downgrade(store.engine, "0007")  # a model that followed the setup gets the router every model had then
    with store.engine.connect() as connection:
        assert connection.execute(text("SELECT router FROM served_models")).scalar_one() == "least-load"
        assert "autoscaler" not in set(connection.execute(text("SELECT * FROM served_models")).keys())
