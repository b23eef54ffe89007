"""Gangs and elastic jobs on a real ``tessera up`` with real processes (the acceptance scenario of the live-cluster
issue): a 2-worker gang on a 2-GPU pool runs ranks 0 and 1 of WORLD_SIZE 2; an elastic 1-4 job on 4 GPUs grows to 4,
gives 2 back when a higher-priority 2-GPU job arrives and grows back when it ends; a server killed with -9 in the
middle of a resize loses no rank and starts none twice.

Each rank appends ``launch rank world pid`` to a shared file when it starts and ``stop ...`` when its SIGTERM comes, so
the test sees every process that ever ran, not only what the API says."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from live_server import LiveServer, alive, wait_for

pytestmark = pytest.mark.e2e

RANK_SCRIPT = (
    'echo "launch $TESSERA_RESTARTS $RANK $WORLD_SIZE $$" >> {starts}; '
    "trap 'echo \"stop $TESSERA_RESTARTS $RANK $WORLD_SIZE $$\" >> {starts}; exit 0' TERM; "
    "while :; do sleep 0.05; done"
)


def _lines(path: Path) -> list[list[str]]:
    return [line.split() for line in path.read_text().splitlines()] if path.exists() else []


def _launches(path: Path) -> list[tuple[str, str, str, str]]:
    """(launch number, rank, world size, pid) of every rank that started."""
    return [(a, r, w, p) for kind, a, r, w, p in _lines(path) if kind == "launch"]


def _running_world(path: Path, launch: int) -> int | None:
    """The world size of launch ``launch`` once all its ranks have started, else None."""
    ranks = [(r, w) for a, r, w, _ in _launches(path) if int(a) == launch]
    if not ranks:
        return None
    world = int(ranks[0][1])
    return world if sorted(int(r) for r, _ in ranks) == list(range(world)) else None


def test_a_gang_runs_every_rank_with_torchruns_variables(tmp_path: Path) -> None:
    server = LiveServer(tmp_path / "server", gpus="2xA100-80GB")
    server.start()
    try:
        with server.client() as client:
            env = 'echo "WORLD_SIZE=$WORLD_SIZE RANK=$RANK LOCAL_RANK=$LOCAL_RANK MASTER_PORT=$MASTER_PORT"'
            gang = client.submit({"command": ["sh", "-c", env], "workers": 2, "gpus": 1, "cwd": str(tmp_path)})
            done = wait_for(lambda: (w := client.workload(gang["id"]))["state"] in ("succeeded", "failed") and w)
            assert done["state"] == "succeeded", done
            logs = ["".join(client.read_logs(gang["id"], rank=rank)) for rank in (0, 1)]
        assert "WORLD_SIZE=2 RANK=0 LOCAL_RANK=0" in logs[0] and "WORLD_SIZE=2 RANK=1 LOCAL_RANK=1" in logs[1]
        ports = {line.rsplit("=", 1)[1] for text in logs for line in text.splitlines() if "MASTER_PORT" in line}
        assert len(ports) == 1 and ports != {"0"}
    finally:
        server.stop()


def _elastic_server(tmp_path: Path) -> tuple[LiveServer, Path, dict[str, Any]]:
    server = LiveServer(tmp_path / "server", gpus="4xA100-80GB")
    server.start()
    starts = tmp_path / "starts"
    script = RANK_SCRIPT.format(starts=starts)
    body = {"command": ["sh", "-c", script], "gpus": 1, "elastic_min": 1, "elastic_max": 4, "cwd": str(tmp_path)}
    with server.client() as client:
        elastic = client.submit({**body, "priority": "best-effort", "checkpointable": True, "name": "elastic"})
    return server, starts, elastic


def test_an_elastic_job_grows_shrinks_for_a_higher_priority_and_grows_back(tmp_path: Path) -> None:
    server, starts, elastic = _elastic_server(tmp_path)
    try:
        with server.client() as client:
            wait_for(lambda: _running_world(starts, 0) == 4, timeout_s=30)
            assert client.workload(elastic["id"])["workers"] == 4
            urgent = client.submit({"command": ["sleep", "600"], "workers": 2, "gpus": 1, "priority": "training"})
            # Within 30 s: the elastic job runs 2 ranks (launch 1), the urgent job runs.
            wait_for(lambda: _running_world(starts, 1) == 2, timeout_s=30)
            wait_for(lambda: client.workload(urgent["id"])["state"] == "running", timeout_s=30)
            assert client.workload(elastic["id"])["workers"] == 2
            client.cancel(urgent["id"])
            wait_for(lambda: _running_world(starts, 2) == 4, timeout_s=30)  # grown back
            events = [e["kind"] for e in client.events(elastic["id"])]
        assert "shrunk" in events and "grown" in events and events.count("restarted") == 2
        stopped = [(a, r) for kind, a, r, *_ in _lines(starts) if kind == "stop"]
        assert sorted(stopped) == sorted([("0", str(r)) for r in range(4)] + [("1", "0"), ("1", "1")])
    finally:
        server.cancel_all()
        server.stop()


def test_a_server_killed_during_a_resize_loses_no_rank_and_starts_none_twice(tmp_path: Path) -> None:
    server, starts, elastic = _elastic_server(tmp_path)
    try:
        with server.client() as client:
            wait_for(lambda: _running_world(starts, 0) == 4, timeout_s=30)
            client.submit({"command": ["sleep", "600"], "workers": 2, "gpus": 1, "priority": "training"})
            # Kill the server as soon as the shrink is stored (the old ranks may still be stopping).
            wait_for(lambda: client.workload(elastic["id"])["workers"] == 2, timeout_s=30, interval_s=0.01)
        server.kill_hard()
        server.start()
        with server.client() as client:
            wait_for(lambda: _running_world(starts, 1) == 2, timeout_s=30)
            wait_for(lambda: all(w["state"] == "running" for w in client.workloads(["pending", "running"])))
            row = client.workload(elastic["id"])
        launches = Counter((a, r) for a, r, _, _ in _launches(starts))
        assert all(count == 1 for count in launches.values()), launches  # no rank of a launch started twice
        assert set(launches) == {("0", str(r)) for r in range(4)} | {("1", "0"), ("1", "1")}
        live = [int(p) for a, _, _, p in _launches(starts) if a == "1"]
        assert all(alive(pid) for pid in live) and row["workers"] == 2 and row["attempts"] == 2
        old = [int(p) for a, _, _, p in _launches(starts) if a == "0"]
        assert not any(alive(pid) for pid in old)
    finally:
        server.cancel_all()
        server.stop()
