"""Issue 25's acceptance for workload limits and the log cap, through a real ``tessera up`` as root with one OS user
per tenant: a tenant's fork bomb (bounded by the test) is stopped by its cgroup's ``pids.max`` while the server keeps
answering ``/healthz`` (the p99 is printed), and its cgroups show the limits it was given; a tenant's workload that
floods its log leaves at most about twice the cap on disk while another tenant's log is read meanwhile (the read
latencies are printed). Timing is reported, not asserted beyond "it answered"; bench/fork_bomb.py measures the
fork bomb with the default limits (and others, or none)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from live_server import LiveServer, wait_for

from tessera.backends import cgroup_limits
from tessera.backends.accounts import user_name

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(os.geteuid() != 0, reason="per-tenant OS users and cgroup limits need a root server"),
]

PIDS_MAX = 64
LOG_CAP = 1024 * 1024
# Each shell starts two more, 11 levels down (4095 shells and as many sleeps: the test's bound), and each lives 4 s.
# The first shell forks nothing once the bomb has gone off (a shell whose fork fails exits): it waits for its sleep.
FORK_BOMB = """
b() { [ $1 -gt 0 ] && { b $(($1 - 1)) & b $(($1 - 1)) & }; sleep 4; }
sleep 120 & keep=$!
echo "pid $$"
(b 11)
wait $keep
"""
FLOOD_BYTES = 300 * 1000 * 1000


@pytest.fixture
def tenants() -> Iterator[list[str]]:
    """The tenants a test made: their OS users are removed after it."""
    made: list[str] = []
    yield made
    for tenant in made:
        subprocess.run(["userdel", user_name(tenant)], capture_output=True, check=False)


@pytest.fixture
def server(tenants: list[str]) -> Iterator[LiveServer]:
    # Not pytest's tmp_path: its parents are 0700, so tenants' users could not reach their homes inside.
    data_dir = Path(tempfile.mkdtemp(prefix="tessera-limits-", dir="/tmp"))
    args = ("--workload-pids-max", str(PIDS_MAX), "--log-max-size", "1MiB")
    live = LiveServer(data_dir, gpus="2xA100-80GB", run_as="tenant-users", args=args)
    live.start()
    yield live
    live.cancel_all()
    live.stop()
    shutil.rmtree(data_dir, ignore_errors=True)


def _token(server: LiveServer, tenants: list[str]) -> str:
    tenant = f"lim{uuid.uuid4().hex[:8]}"
    tenants.append(tenant)
    with server.client() as admin:
        return str(admin.create_token(tenant)["token"])


class _Sampler:
    """Calls ``probe`` every ``interval_s`` on a thread and keeps how long each call took (ms)."""

    def __init__(self, probe: Callable[[], None], interval_s: float = 0.01) -> None:
        self.probe, self.interval_s = probe, interval_s
        self.latencies_ms: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> _Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.perf_counter()
            self.probe()
            self.latencies_ms.append((time.perf_counter() - started) * 1000)
            self._stop.wait(self.interval_s)

    def summary(self) -> str:
        ordered = sorted(self.latencies_ms)
        p50, p99 = ordered[len(ordered) // 2], ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
        return f"n={len(ordered)} p50={p50:.1f} ms p99={p99:.1f} ms max={ordered[-1]:.1f} ms"


def _log_text(server: LiveServer, token: str, workload_id: int) -> str:
    with server.client(token) as client:
        return str(client.logs(workload_id)["data"])


def test_a_fork_bomb_stops_at_pids_max_and_the_server_keeps_answering(server: LiveServer, tenants: list[str]) -> None:
    token = _token(server, tenants)
    with server.client(token) as client, httpx.Client(base_url=server.url, timeout=10) as http:
        statuses: list[int] = []
        with _Sampler(lambda: statuses.append(http.get("/healthz").status_code)) as healthz:
            spec = {"command": ["sh", "-c", FORK_BOMB], "mem": "512MiB", "cpu": "1"}
            workload_id = int(client.submit(spec)["id"])
            text = wait_for(lambda: "pid " in (t := _log_text(server, token, workload_id)) and t, timeout_s=60)
            pid = int(text.split()[1])
            directories = cgroup_limits.directories_of(pid)
            events = directories["pids"] / "pids.events"
            wait_for(lambda: "max 0" not in events.read_text(), timeout_s=30)
            time.sleep(5)  # the bomb's processes live 4 s: the server is measured while they are there
            refused = int(events.read_text().split()[-1])
            limits = {name: _read(directories[c], name) for c, name in _LIMIT_FILES if (directories[c] / name).exists()}
            peak = _read(directories["pids"], "pids.peak") if (directories["pids"] / "pids.peak").exists() else None
        started = [e["message"] for e in client.events(workload_id) if e["kind"] == "started"]
        client.cancel(workload_id)
    print(f"fork bomb: {refused} forks refused by pids.max={PIDS_MAX}, peak {peak}; /healthz {healthz.summary()}")
    assert refused > 0  # stopped by pids.max, not only by the test's bound
    assert limits["pids.max"] == str(PIDS_MAX) and (peak is None or int(peak) <= PIDS_MAX)
    assert limits.get("memory.max", limits.get("memory.limit_in_bytes")) == str(512 * 1024 * 1024)
    assert limits.get("cpu.max", limits.get("cpu.cfs_quota_us")) in ("100000 100000", "100000")
    assert started == ["started (local backend); limits: 64 processes, 512 MiB memory, 1 CPU quota"]
    assert statuses and set(statuses) == {200}  # every /healthz answered, none timed out (10 s)


_LIMIT_FILES = [
    ("pids", "pids.max"),
    ("memory", "memory.max"),
    ("memory", "memory.limit_in_bytes"),
    ("cpu", "cpu.max"),
    ("cpu", "cpu.cfs_quota_us"),
]


def _read(directory: Path, name: str) -> str:
    return (directory / name).read_text().strip()


def _on_disk(log: Path) -> int:
    total = 0
    for path in (log, log.with_name(log.name + ".1")):
        with contextlib.suppress(FileNotFoundError):
            total += path.stat().st_size
    return total


def test_a_flooded_log_stays_under_its_cap_and_other_logs_read_meanwhile(
    server: LiveServer, tenants: list[str]
) -> None:
    flooder, reader = _token(server, tenants), _token(server, tenants)
    with server.client(reader) as client:
        quiet_id = int(client.submit({"command": ["sh", "-c", "echo quiet line; sleep 120"]})["id"])
        wait_for(lambda: "quiet line" in _log_text(server, reader, quiet_id), timeout_s=60)
    with server.client(flooder) as client:
        script = f"head -c {FLOOD_BYTES} /dev/zero | tr '\\0' x; echo; echo the end"
        flood_id = int(client.submit({"command": ["sh", "-c", script]})["id"])
    log = server.data_dir / "logs" / f"{flood_id}.log"
    most, reads = 0, []
    with server.client(reader) as client:

        def read_quiet() -> None:
            reads.append(client.logs(quiet_id)["data"])

        with _Sampler(read_quiet, interval_s=0.005) as latency:
            with server.client() as admin:
                while admin.workload(flood_id)["state"] in ("pending", "running"):
                    most = max(most, _on_disk(log))
                    time.sleep(0.005)
            most = max(most, _on_disk(log))
    with server.client(flooder) as client:
        tail = client.logs(flood_id, tail=1)["data"]
        state = client.workload(flood_id)["state"]
    print(
        f"log flood: {FLOOD_BYTES} B past a {LOG_CAP} B cap, at most {most} B on disk; "
        f"another tenant's log read {latency.summary()}"
    )
    assert state == "succeeded" and tail == "the end\n"
    assert most <= 2 * LOG_CAP + 64 * 1024
    assert reads and all(r == "quiet line\n" for r in reads)
