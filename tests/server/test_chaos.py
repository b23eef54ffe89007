"""Chaos: real ``tessera up`` servers killed with -9 while short workloads run, at every fault-injection point
(``TESSERA_CRASH_AT``, ``tessera.faults``) and at random moments, on SQLite and on PostgreSQL (issue 17). The server
is restarted after each crash. Then every accepted workload must have ended (none lost, none stuck), each must have run
exactly once (each run appends its name to a marker file) and no process of any workload may be left once the last
server has stopped.

Marked ``slow`` (and ``e2e``): it runs in ``make test`` but takes about a minute per database on 2 cores, most of it
server restarts. Run ``pytest -s tests/server/test_chaos.py`` to see the counts it prints (one line per database).
``TESSERA_CHAOS_SEED`` changes the random moments and which visit of each point crashes.
"""

from __future__ import annotations

import contextlib
import os
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from live_server import LiveServer, wait_for

from tessera.client.http import ApiError, TesseraClient
from tessera.faults import ENV as CRASH_ENV
from tessera.faults import POINTS

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

WORKLOADS = 60  # per database: 120 in a full run
GPUS = "4xA100-80GB"  # simulated; a quarter GPU each: 16 at once
RUN_S = 0.3  # how long each workload sleeps after marking its run
# Each phase: a crash point (its visit drawn from the range), or None for a kill -9 at a random moment; then the
# number of workloads submitted to that server (fewer when it dies first: the rest go to the next one).
# The first phase of each point crashes at an early visit, so that every point is reached at least once.
PHASES: list[tuple[str | None, range, int]] = [
    ("after-launch", range(1, 6), 12),
    ("before-end", range(1, 4), 6),
    ("mid-commit", range(1, 2), 6),
    (None, range(0), 6),
    ("after-launch", range(2, 7), 6),
    ("mid-commit", range(1, 3), 6),
    ("before-end", range(2, 8), 6),
    (None, range(0), 6),
]
TERMINAL = {"succeeded", "failed", "cancelled", "preempted"}
START_TIMEOUT_S = 90.0  # a loaded 2-core machine can take half a minute to start `tessera up`
POINT_WAIT_S = 8.0  # how long a server may take to reach its crash point once fed (then the test kills it)


@dataclass
class Tally:
    crashes: Counter[str] = field(default_factory=Counter)  # per point, and "kill -9" for the random ones
    unreached: list[str] = field(default_factory=list)  # points a server never reached (it was killed instead)
    accepted: dict[str, int] = field(default_factory=dict)  # workload name -> id, for every submit answered 201
    unanswered: set[str] = field(default_factory=set)  # submitted, no answer: stored or not, the next server knows


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest) -> str | None:
    return None if request.param == "sqlite" else str(request.getfixturevalue("postgres_url"))


def test_crashes_at_every_point_lose_nothing_run_nothing_twice_and_leave_nothing(
    tmp_path: Path, db_url: str | None
) -> None:
    started_s = time.monotonic()
    seed = int(os.environ.get("TESSERA_CHAOS_SEED", "17"))
    rng = random.Random(seed)
    marker = tmp_path / "runs.txt"
    marker.touch()
    names = [f"w{i:03d}" for i in range(WORKLOADS)]
    to_submit = list(names)
    live = LiveServer(tmp_path / "data", gpus=GPUS, db_url=db_url)
    tally = Tally()
    try:
        for point, visits, batch in PHASES:
            crash = f"{point}:{rng.choice(visits)}" if point else None
            _crash_phase(live, crash, to_submit, batch, marker, rng, tally)
        live.env = {}
        live.start(START_TIMEOUT_S)
        with live.client() as client:
            _submit(client, to_submit, WORKLOADS, marker, tally)
            assert not to_submit and not tally.unanswered
            wait_for(lambda: not client.workloads(["pending", "running"]), timeout_s=90, interval_s=0.3)
            stored = client.workloads()
            found = sum(e["kind"] == "found" for w in stored for e in client.events(w["id"]))
    finally:
        live.stop()
    orphans = _orphans(tmp_path)

    runs = Counter(marker.read_text().split())
    by_name = {w["name"]: w for w in stored}
    lost = sorted(set(tally.accepted) - set(by_name))
    stuck = sorted(n for n, w in by_name.items() if w["state"] not in TERMINAL)
    twice = sorted(n for n in by_name if runs[n] > 1)
    never = sorted(n for n in by_name if runs[n] == 0)
    states = Counter(w["state"] for w in stored)
    db = "sqlite" if db_url is None else "postgresql"
    print(
        f"\nchaos [{db}, seed {seed}]: {len(stored)} workloads ({len(tally.accepted)} accepted answers), "
        f"crashes {dict(sorted(tally.crashes.items()))}, points not reached {tally.unreached}, "
        f"found by recovery without a stored handle {found}, runs {sum(runs.values())}, run twice {len(twice)}, "
        f"never ran {len(never)}, lost {len(lost)}, "
        f"stuck {len(stuck)}, orphans {len(orphans)}, states {dict(states)}, "
        f"{time.monotonic() - started_s:.0f} s"
    )
    assert set(by_name) == set(names), "every workload was submitted once and stored once"
    assert not lost and not stuck, (lost, stuck)
    assert not twice, {n: runs[n] for n in twice}
    assert not never and states == {"succeeded": WORKLOADS}, (never, states)
    assert not orphans, orphans
    assert all(tally.crashes[p] >= 1 for p in POINTS), tally.crashes  # each point crashed a server at least once
    assert tally.crashes["kill -9"] >= 2


def _crash_phase(
    live: LiveServer,
    crash: str | None,
    to_submit: list[str],
    batch: int,
    marker: Path,
    rng: random.Random,
    tally: Tally,
) -> None:
    """One server's life: started (with ``crash`` armed), fed ``batch`` workloads, killed by the crash point or, for
    ``crash=None`` (or a point it does not reach in time), by the test with -9."""
    live.env = {CRASH_ENV: crash} if crash else {}
    before = _crash_lines(live)
    with contextlib.suppress(RuntimeError):  # it crashed during recovery or its first steps, before it answered
        live.start(START_TIMEOUT_S)
    assert live.process is not None
    if live.process.poll() is None:
        with live.client() as client:
            _submit(client, to_submit, batch, marker, tally)
        deadline_s = time.monotonic() + (rng.uniform(0.2, 1.5) if crash is None else POINT_WAIT_S)
        while live.process.poll() is None and time.monotonic() < deadline_s:
            time.sleep(0.05)
    if live.process.poll() is None:
        live.kill_hard()
    assert live.process.wait() == -9, (live.data_dir / "server.log").read_text()[-3000:]
    crashed = _crash_lines(live) - before
    tally.crashes.update(crashed)
    if not crashed:
        tally.crashes["kill -9"] += 1
        if crash is not None:
            tally.unreached.append(crash)


def _crash_lines(live: LiveServer) -> Counter[str]:
    """How often the server's log says it crashed at each point (the log is kept across restarts)."""
    path = live.data_dir / "server.log"
    text = path.read_text() if path.exists() else ""
    return Counter({point: text.count(f"{CRASH_ENV}: crashing at {point} ") for point in POINTS})


def _submit(client: TesseraClient, to_submit: list[str], count: int, marker: Path, tally: Tally) -> None:
    """Submits up to ``count`` of ``to_submit`` (removing them); stops at the first that gets no answer (the server
    died): that one may or may not have been stored, so it goes back to ``to_submit`` unless the next server has it."""
    try:
        if tally.unanswered:
            stored = {w["name"] for w in client.workloads()}
            to_submit[:0] = sorted(tally.unanswered - stored)
            tally.unanswered.clear()
        for _ in range(min(count, len(to_submit))):
            name = to_submit.pop(0)
            tally.unanswered.add(name)
            command = ["sh", "-c", f"echo {name} >> {marker}; sleep {RUN_S}"]
            created = client.submit({"command": command, "name": name, "gpus": 1, "gpu_fraction": 0.25})
            tally.unanswered.discard(name)
            tally.accepted[name] = int(created["id"])
    except ApiError as error:
        assert error.status == 0, error  # no answer: the server is gone


def _orphans(tmp_path: Path, drain_s: float = 5.0) -> list[str]:
    """Command lines of processes still running that belong to this test's workloads (their supervisors name an
    exit file under ``tmp_path``; their commands name the marker file there), after up to ``drain_s``."""
    deadline_s = time.monotonic() + drain_s
    while True:
        left = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                argv = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if str(tmp_path) in argv and state != "Z":
                left.append(f"{entry.name}: {argv}")
        if not left or time.monotonic() > deadline_s:
            return left
        time.sleep(0.2)
