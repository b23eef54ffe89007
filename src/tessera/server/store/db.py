"""Engines and migrations: ``open_engine(url)`` connects (SQLite in WAL mode, or PostgreSQL) and brings the schema to
the newest Alembic revision. Called once by ``tessera up`` and by tests.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url

from tessera.errors import InvalidRequestError

MIGRATIONS_DIR = Path(__file__).with_name("migrations")


def normalise_url(url: str) -> str:
    """``postgresql://`` and ``postgres://`` mean the psycopg 3 driver; a bare path means a SQLite file."""
    if url.startswith("postgres://"):
        url = "postgresql://" + url.removeprefix("postgres://")
    if url.startswith("postgresql://"):
        return "postgresql+psycopg://" + url.removeprefix("postgresql://")
    if "://" not in url:
        return f"sqlite:///{Path(url).expanduser()}"
    return url


def open_engine(url: str, *, migrate: bool = True) -> Engine:
    """An engine for ``url`` with the schema migrated to the newest revision."""
    url = normalise_url(url)
    try:
        parsed = make_url(url)
    except Exception as exc:  # sqlalchemy raises ArgumentError with a long message
        raise InvalidRequestError("--db", f"not a database URL: {url!r}") from exc
    if parsed.get_backend_name() not in ("sqlite", "postgresql"):
        raise InvalidRequestError(
            "--db", f"unsupported database {parsed.get_backend_name()!r} (use sqlite or postgresql)"
        )
    kwargs: dict[str, Any] = {}
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        kwargs["connect_args"] = {"check_same_thread": False, "timeout": 30}
    else:
        kwargs["pool_pre_ping"] = True
    engine = create_engine(url, **kwargs)
    if parsed.get_backend_name() == "sqlite":
        event.listen(engine, "connect", _sqlite_pragmas)
    if migrate:
        upgrade(engine)
    return engine


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")  # readers never block the writer
    cursor.execute("PRAGMA synchronous=NORMAL")  # durable across process crashes in WAL mode
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.close()


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Apply Alembic migrations up to ``revision`` on ``engine``."""
    _migrate(engine, lambda config: command.upgrade(config, revision))


def downgrade(engine: Engine, revision: str) -> None:
    """Undo Alembic migrations down to ``revision`` on ``engine`` (by hand, or in tests)."""
    _migrate(engine, lambda config: command.downgrade(config, revision))


def _migrate(engine: Engine, run: Callable[[Config], None]) -> None:
    """Runs ``run`` in one transaction. On SQLite, foreign keys are off meanwhile (it cannot switch them inside a
    transaction): a batch migration copies a table, drops the original and renames the copy, and dropping
    ``workloads`` must not trip the events that refer to it. Raises if the migrated data break a foreign key."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    with engine.connect() as connection:
        sqlite = connection.dialect.name == "sqlite"
        if sqlite:
            connection.exec_driver_sql("PRAGMA foreign_keys=OFF")
            connection.commit()
        try:
            with connection.begin():
                config.attributes["connection"] = connection
                run(config)
                if sqlite and connection.exec_driver_sql("PRAGMA foreign_key_check").first() is not None:
                    raise RuntimeError("a migration left rows that break a foreign key")
        finally:
            if sqlite:
                connection.exec_driver_sql("PRAGMA foreign_keys=ON")
                connection.commit()
