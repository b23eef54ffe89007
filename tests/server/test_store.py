"""The store on SQLite and on a real PostgreSQL server (``make test`` starts one): migrations match the models, and
the control plane's core scenario — shares on one GPU, a waiting workload, restart with recovery — behaves the same.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from server_harness import MakeHarness
from sqlalchemy import text

from tessera.server.store.db import normalise_url, open_engine
from tessera.server.store.models import Base


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'store.db'}"
    return str(request.getfixturevalue("postgres_url"))


def test_migrations_build_exactly_the_models(db_url: str) -> None:
    engine = open_engine(db_url)
    with engine.connect() as connection:
        assert compare_metadata(MigrationContext.configure(connection), Base.metadata) == []
    open_engine(db_url)  # migrating an up-to-date store again changes nothing


def test_sharing_waiting_and_recovery(make_harness: MakeHarness, db_url: str) -> None:
    h = make_harness("1xA100-80GB", db_url=db_url)
    ids = [h.submit(gpus=1, gpu_fraction=0.3)["id"] for _ in range(4)]
    h.step()
    assert [h.get(i)["state"] for i in ids] == ["running", "running", "running", "pending"]
    launched = {s.workload_id for s in h.backend.launched}

    # A new server on the same store (the old one "crashed"): it re-adopts the three, launches nothing again.
    h2 = make_harness("1xA100-80GB", db_url=db_url)
    assert {r.workload_id for r in h2.backend.adopted} == launched
    assert h2.backend.launched == []
    h2.step()
    assert [h2.get(i)["state"] for i in ids] == ["running", "running", "running", "pending"]
    h2.backend.finish(str(ids[1]), 0)
    h2.step()
    assert h2.get(ids[1])["state"] == "succeeded"
    assert h2.get(ids[3])["state"] == "running"
    assert [s.workload_id for s in h2.backend.launched] == [str(ids[3])]


def test_launch_that_never_reached_the_store_is_found_not_duplicated(make_harness: MakeHarness) -> None:
    h = make_harness("1xA100-80GB")
    wid = h.submit(gpus=1)["id"]
    h.step()
    ref = h.backend.find(str(wid))
    assert ref is not None
    # Simulate a crash between launch and recording the process: the row has no handle.
    with h.server.ctx.store.engine.begin() as connection:
        connection.execute(text("UPDATE workloads SET handle = NULL WHERE id = :id"), {"id": wid})
    h2 = make_harness("1xA100-80GB", db_url=h.db_url, backend=h.backend)  # same host: the process is still there
    assert [r.workload_id for r in h2.backend.adopted] == [str(wid)]
    assert len(h2.backend.launched) == 1  # launched once, by the first server
    assert h2.get(wid)["state"] == "running"
    handle = h2.server.ctx.store.get_workload(wid)
    assert handle is not None and handle.handle == ref.to_json()  # what was found is stored: a second crash keeps it
    assert any(e.kind == "found" for e in h2.server.ctx.store.events(wid))


def test_a_workload_that_ended_while_no_server_ran_and_no_handle_was_stored_ends_once(
    make_harness: MakeHarness,
) -> None:
    h = make_harness("1xA100-80GB")
    wid = h.submit(gpus=1)["id"]
    h.step()
    with h.server.ctx.store.engine.begin() as connection:  # the crash came before the handle was stored
        connection.execute(text("UPDATE workloads SET handle = NULL WHERE id = :id"), {"id": wid})
    h.backend.close()
    h.backend.finish(str(wid), 0)  # it ends while no server watches
    h2 = make_harness("1xA100-80GB", db_url=h.db_url, backend=h.backend)
    h2.step()
    assert h2.get(wid)["state"] == "succeeded" and h2.get(wid)["exit_code"] == 0
    assert len(h2.backend.launched) == 1  # not launched again
    h3 = make_harness("1xA100-80GB", db_url=h.db_url, backend=h.backend)
    h3.step()
    assert len(h3.backend.launched) == 1 and h3.get(wid)["state"] == "succeeded"


def test_normalise_url() -> None:
    assert normalise_url("postgresql://u@h/db") == "postgresql+psycopg://u@h/db"
    assert normalise_url("postgres://u@h/db") == "postgresql+psycopg://u@h/db"
    assert normalise_url("/tmp/x.db") == "sqlite:////tmp/x.db"
