"""End to end through a real ``tessera up`` with real workload processes (marked e2e; a few seconds each).

What a user relies on: fractional jobs share one GPU at the same time with the right environment, a job that does
not fit waits with a stated reason and starts when room frees, cancel stops the process, logs stream with ``-f``,
and a server killed with -9 loses nothing: running processes are re-adopted, ones that ended meanwhile are recorded.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from live_server import ADMIN, LiveServer, alive, wait_for

from tessera.client.http import TesseraClient

pytestmark = pytest.mark.e2e


@pytest.fixture
def server(tmp_path: Path) -> Iterator[LiveServer]:
    live = LiveServer(tmp_path / "data")
    live.start()
    yield live
    live.cancel_all()
    live.stop()


def _submit(client: TesseraClient, command: str, **spec: object) -> int:
    created = client.submit({"command": ["bash", "-c", command], **spec})
    return int(created["id"])


def test_fractional_jobs_share_a_gpu_a_fourth_waits_then_starts(server: LiveServer) -> None:
    with server.client() as client:
        share = 'echo "env $TESSERA_WORKLOAD_ID $CUDA_VISIBLE_DEVICES $TESSERA_GPU_MILLI"; sleep 4'
        ids = [_submit(client, share, gpus=1, gpu_fraction=0.3, name=f"share-{i}") for i in range(3)]
        fourth = _submit(client, "echo fourth ran", gpus=1, gpu_fraction=0.3)
        running = wait_for(lambda: _running(client, ids))
        assert len({w["placement"][0]["uuids"][0] for w in running}) == 1  # one GPU, three workloads at once
        waiting = wait_for(lambda: "30% free" in client.workload(fourth)["reason"] and client.workload(fourth))
        assert waiting["state"] == "pending"
        for wid in ids:
            log = wait_for(partial(_log_text, client, wid))
            uuid = running[0]["placement"][0]["uuids"][0]
            assert log.strip() == f"env {wid} {uuid} 300"
        done = wait_for(
            lambda: client.workload(fourth)["state"] == "succeeded" and client.workload(fourth), timeout_s=30
        )
        wait_for(lambda: all(client.workload(i)["state"] == "succeeded" for i in ids), timeout_s=30)
        assert done["started_at"] >= min(client.workload(i)["finished_at"] for i in ids)  # only once room freed
        assert client.logs(fourth)["data"] == "fourth ran\n"


def test_cancel_stops_the_process_and_logs_follow(server: LiveServer) -> None:
    with server.client() as client:
        ticker = _submit(client, "for i in 1 2 3; do echo tick $i; sleep 0.5; done")
        follower = subprocess.run(
            [sys.executable, "-m", "tessera.cli", "logs", str(ticker), "-f", "--url", server.url, "--token", ADMIN],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert follower.returncode == 0, follower.stderr
        assert follower.stdout == "tick 1\ntick 2\ntick 3\n"

        sleeper = _submit(client, "trap '' TERM; sleep 300")  # ignores SIGTERM: needs the SIGKILL after the grace
        pid = wait_for(lambda: client.workload(sleeper)["state"] == "running" and _pid(server, sleeper))
        client.cancel(sleeper)
        ended = wait_for(
            lambda: client.workload(sleeper)["state"] == "cancelled" and client.workload(sleeper), timeout_s=30
        )
        assert ended["reason"] == "cancelled"
        assert not alive(pid)


def test_server_killed_with_9_loses_nothing_and_readopts_running_processes(tmp_path: Path) -> None:
    live = LiveServer(tmp_path / "data")
    live.start()
    try:
        with live.client() as client:
            quick = _submit(client, "sleep 2; exit 3", gpus=1, gpu_fraction=0.3)
            slow = _submit(client, "sleep 300", gpus=1, gpu_fraction=0.5)
            blocked = _submit(client, "echo late", gpus=1, gpu_fraction=0.5)
            wait_for(lambda: {client.workload(w)["state"] for w in (quick, slow)} == {"running"})
            # launches are made off the loop: the handle is stored a step or two after the workload is running
            slow_pid = wait_for(lambda: _pid(live, slow) and _pid(live, quick) and _pid(live, slow))
        live.kill_hard()
        time.sleep(3)  # the quick one ends while no server is watching
        assert alive(slow_pid)
        live.start()
        with live.client() as client:
            states = {w["id"]: w for w in client.workloads()}
            assert sorted(states) == [quick, slow, blocked]  # nothing lost, nothing duplicated
            finished = wait_for(lambda: client.workload(quick)["state"] == "failed" and client.workload(quick))
            assert finished["exit_code"] == 3
            again = client.workload(slow)
            assert again["state"] == "running" and again["attempts"] == 1
            assert _pid(live, slow) == slow_pid and alive(slow_pid)  # re-adopted, not relaunched
            # The quick one's share was released: the blocked one fits now (0.5 + 0.5).
            wait_for(lambda: client.workload(blocked)["state"] == "succeeded")
            client.cancel(slow)
            wait_for(lambda: client.workload(slow)["state"] == "cancelled", timeout_s=30)
            assert not alive(slow_pid)
    finally:
        live.stop()


def _log_text(client: TesseraClient, workload_id: int) -> str:
    """What the workload has logged so far."""
    return str(client.logs(workload_id)["data"])


def _running(client: TesseraClient, ids: list[int]) -> list[dict[str, Any]] | None:
    """The workloads of ``ids`` when all of them run at once, else None."""
    running = [w for w in client.workloads(["running"]) if w["id"] in ids]
    return running if len(running) == len(ids) else None


def _pid(server: LiveServer, workload_id: int) -> int:
    """The pid in the local backend's handle the store recorded for a workload (the API does not expose it)."""
    import json
    import sqlite3

    with sqlite3.connect(server.data_dir / "tessera.db") as db:
        (handle,) = db.execute("select handle from workloads where id = ?", (workload_id,)).fetchone()
    stored = json.loads(handle) if handle else None  # SQL NULL, or JSON null once cleared
    pid = stored["data"]["pid"] if stored else None
    return int(pid) if pid else 0
