"""Test-suite settings: Hypothesis runs without per-example deadlines (timing is never a pass/fail criterion here;
CI machines are shared and a slow example is not a failure).

The API fuzz tests (tests/server/test_api_fuzz.py) record the requests they sent on their reports; the session ends
with one line that sums them (from every xdist worker) and counts the responses >= 500. The browser tests
(tests/server/test_e2e_dashboard.py) record the screenshots they wrote; the session ends with a line that says how
many and in which folder.

PostgreSQL: `make test` starts a throw-away server (scripts/test-postgres.sh) and exports its SQLAlchemy URL in
TESSERA_TEST_PG_URL; the `postgres_url` fixture gives each test a fresh database on it, and skips without it.

Ray: `shared_ray_cluster` is the one real local Ray cluster the `ray` tests share (tests/backends/ray); the tests
that use it run after the other collected tests, so that the `ray` tests that start their own cluster never run
beside it."""

import os
import secrets
from collections import Counter
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from hypothesis import settings
from psycopg import sql
from sqlalchemy.engine import make_url

settings.register_profile("tessera", deadline=None, print_blob=True)
settings.load_profile("tessera")

PG_URL_ENV = "TESSERA_TEST_PG_URL"
FUZZ_PROPERTY = "fuzz-statuses"  # test_api_fuzz.FUZZ_PROPERTY: {"<role> <status>": count} per test
SCREENSHOT_PROPERTY = "screenshot"  # test_e2e_dashboard.SCREENSHOT_PROPERTY: the path of a screenshot written
_fuzz_sent: Counter[str] = Counter()
_screenshots: set[str] = set()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "teardown":
        for name, value in report.user_properties:
            if name == FUZZ_PROPERTY and isinstance(value, dict):
                _fuzz_sent.update(value)
            elif name == SCREENSHOT_PROPERTY and isinstance(value, str):
                _screenshots.add(value)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    by_folder: dict[str, list[str]] = {}
    for path in sorted(_screenshots):
        folder, _, name = path.rpartition(os.sep)
        by_folder.setdefault(folder, []).append(name)
    for folder, names in by_folder.items():
        terminalreporter.write_line(f"screenshots: {len(names)} written to {folder}{os.sep} ({', '.join(names)})")
    if not _fuzz_sent:
        return
    by_role: Counter[str] = Counter()
    by_status: Counter[int] = Counter()
    for key, count in _fuzz_sent.items():
        role, status = key.split()
        by_role[role] += count
        by_status[int(status)] += count
    errors = sum(n for status, n in by_status.items() if status >= 500)
    roles = ", ".join(f"{role} {n}" for role, n in sorted(by_role.items()))
    terminalreporter.write_line(
        f"schemathesis: {sum(by_role.values())} requests ({roles}), responses >= 500: {errors}, "
        f"by status: {dict(sorted(by_status.items()))}"
    )


def psycopg_url(url: str) -> str:
    """The plain `postgresql://` form of a SQLAlchemy URL (`postgresql+psycopg://...`), for psycopg.connect."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """SQLAlchemy URL (`postgresql+psycopg://...`) of a database created for this test alone, dropped after it."""
    base = os.environ.get(PG_URL_ENV)
    if not base:
        pytest.skip(f"{PG_URL_ENV} is not set: no PostgreSQL test server (`make test` starts one)")
    name = f"tessera_t_{secrets.token_hex(8)}"
    server = psycopg_url(base)
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield make_url(base).set(drivername="postgresql+psycopg", database=name).render_as_string(hide_password=False)
    finally:
        with psycopg.connect(server, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.fixture
def postgres_dsn(postgres_url: str) -> str:
    """The same fresh database as `postgres_url`, in the plain `postgresql://` form psycopg.connect takes."""
    return psycopg_url(postgres_url)


SHARED_RAY_CLUSTER = "shared_ray_cluster"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests on the shared Ray cluster last (a stable sort: the others, and they among themselves, keep their
    order), so the cluster is up only while they run."""
    items.sort(key=lambda item: SHARED_RAY_CLUSTER in getattr(item, "fixturenames", ()))


@pytest.fixture(scope="session")
def shared_ray_cluster() -> Iterator[Any]:
    """A head and nodes ``w1``, ``w2`` with declared GPUs (``ray_cluster.local_cluster``), started once, because
    each start costs 10-20 s on two cores; the tests that take it must leave nothing running on it."""
    from ray_cluster import local_cluster  # tests/backends/ray, on sys.path once its tests are collected

    with local_cluster() as cluster:
        yield cluster
