"""The PostgreSQL test fixture: each test gets its own fresh database on the server `make test` starts."""

import os

import psycopg
import pytest
from sqlalchemy import create_engine, make_url, text


def test_sqlalchemy_round_trip(postgres_url: str) -> None:
    assert postgres_url.startswith("postgresql+psycopg://")
    engine = create_engine(postgres_url)
    try:
        with engine.begin() as conn:
            conn.execute(text("CREATE TABLE nodes (name text PRIMARY KEY, gpus integer NOT NULL)"))
            rows = [{"name": "n1", "gpus": 8}, {"name": "n2", "gpus": 2}]
            conn.execute(text("INSERT INTO nodes VALUES (:name, :gpus)"), rows)
        with engine.connect() as conn:
            back = conn.execute(text("SELECT name, gpus FROM nodes ORDER BY name")).all()
        assert [tuple(r) for r in back] == [("n1", 8), ("n2", 2)]
    finally:
        engine.dispose()


@pytest.mark.parametrize("run", [1, 2])
def test_each_test_gets_a_fresh_database(postgres_url: str, postgres_dsn: str, run: int) -> None:
    base = make_url(os.environ["TESSERA_TEST_PG_URL"]).database
    with psycopg.connect(postgres_dsn) as conn:
        current = conn.execute("SELECT current_database()").fetchone()
        tables = conn.execute("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'").fetchone()
        # Both runs create the same table: were the database shared, the second would find it there.
        conn.execute("CREATE TABLE probe (run integer)")
    assert current is not None and tables is not None
    assert current[0] == make_url(postgres_url).database
    assert current[0] != base and current[0].startswith("tessera_t_")
    assert tables[0] == 0
