"""Gangs and elastic jobs on a real ``tessera up`` (real processes, simulated GPUs): how long each step of the live
cluster issue's acceptance scenario takes, measured from the submission that causes it to the moment every rank of
the new launch runs (each rank appends ``launch LAUNCH RANK WORLD PID`` to a file when it starts).

1. a 2-worker gang on a 2-GPU pool: its ranks' WORLD_SIZE and RANK (from their logs);
2. an elastic 1-4 job on 4 GPUs (best-effort, checkpointable): seconds until it runs on 4;
3. a training-class 2-GPU gang arrives: seconds until the elastic job runs on 2 and the newcomer runs;
4. the newcomer is cancelled: seconds until the elastic job runs on 4 again;
5. the same shrink with the server killed (-9) as soon as it is stored, then restarted: whether any rank of a
   launch started twice, whether the old ranks are gone and the new ones run, and the seconds it took.

Prints one line per step, then one JSON line with every figure. The acceptance asks for the shrink within 30 s.
Usage: ``python bench/live_elastic.py [--users server|tenant-users]`` (``tenant-users`` needs root).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from tessera.client.http import TesseraClient, wait_healthy

T = TypeVar("T")
ADMIN = "live-elastic-bench-token-0123456789"
RANK = (
    'echo "launch $TESSERA_RESTARTS $RANK $WORLD_SIZE $$" >> {starts}; '
    "trap 'exit 0' TERM; while :; do sleep 0.05; done"
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def until(predicate: Callable[[], T | None | bool], timeout_s: float = 60.0) -> T:
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value  # type: ignore[return-value]
        if time.monotonic() > deadline:
            raise SystemExit(f"not within {timeout_s} s")
        time.sleep(0.02)


class Server:
    def __init__(self, data: Path, gpus: str, users: str) -> None:
        self.data, self.gpus, self.users, self.port = data, gpus, users, free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        command = [sys.executable, "-m", "tessera.cli", "up", "--port", str(self.port), "--gpus", self.gpus]
        command += ["--data-dir", str(self.data), "--run-as", self.users]
        log = (self.data.parent / f"{self.data.name}.log").open("ab")
        env = {**os.environ, "TESSERA_ADMIN_TOKEN": ADMIN}
        self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        wait_healthy(self.url, 60, self.process.poll)

    def kill(self) -> None:
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait()

    def stop(self, client: TesseraClient) -> None:
        for w in client.workloads(["pending", "running"]):
            client.cancel(w["id"])
        until(lambda: not client.workloads(["running"]))
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(timeout=30)


def launches(starts: Path) -> list[tuple[int, int, int, int]]:
    lines = starts.read_text().split("\n") if starts.exists() else []
    return [tuple(int(x) for x in line.split()[1:]) for line in lines if line.startswith("launch ")]  # type: ignore[misc]


def world_of(starts: Path, launch: int) -> int | None:
    ranks = sorted(r for a, r, _, _ in launches(starts) if a == launch)
    worlds = {w for a, _, w, _ in launches(starts) if a == launch}
    return worlds.pop() if len(worlds) == 1 and ranks == list(range(next(iter(worlds), 0))) and ranks else None


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def gang(root: Path, users: str) -> dict[str, Any]:
    server = Server(root / "gang", "2xA100-80GB", users)
    server.start()
    with TesseraClient(server.url, ADMIN) as client:
        script = 'echo "WORLD_SIZE=$WORLD_SIZE RANK=$RANK"'
        created = client.submit({"command": ["sh", "-c", script], "workers": 2, "gpus": 1, "cwd": str(root)})
        done = until(lambda: (w := client.workload(created["id"]))["state"] in ("succeeded", "failed") and w)
        logs = ["".join(client.read_logs(created["id"], rank=r)).strip() for r in (0, 1)]
        server.stop(client)
    print(f"gang: {done['state']}; rank 0 says {logs[0]!r}, rank 1 says {logs[1]!r}")
    return {"gang_state": done["state"], "gang_logs": logs}


def elastic(root: Path, users: str, kill: bool) -> dict[str, Any]:
    name = "killed" if kill else "elastic"
    server = Server(root / name, "4xA100-80GB", users)
    server.start()
    starts = root / f"{name}.starts"
    body = {"command": ["sh", "-c", RANK.format(starts=starts)], "gpus": 1, "elastic_min": 1, "elastic_max": 4}
    out: dict[str, Any] = {}
    client = TesseraClient(server.url, ADMIN)
    began = time.monotonic()
    job = client.submit({**body, "cwd": str(root), "priority": "best-effort", "checkpointable": True})
    until(lambda: world_of(starts, 0) == 4)
    out["grow_s"] = round(time.monotonic() - began, 2)
    began = time.monotonic()
    urgent = client.submit({"command": ["sleep", "600"], "workers": 2, "gpus": 1, "priority": "training"})
    if kill:
        until(lambda: client.workload(job["id"])["workers"] == 2)
        server.kill()
        client.close()
        server.start()
        client = TesseraClient(server.url, ADMIN)
    until(lambda: world_of(starts, 1) == 2 and client.workload(urgent["id"])["state"] == "running")
    out["shrink_s"] = round(time.monotonic() - began, 2)
    counts = Counter((a, r) for a, r, _, _ in launches(starts))
    out["ranks_started_twice"] = sum(1 for c in counts.values() if c > 1)
    out["old_ranks_alive"] = sum(alive(p) for a, _, _, p in launches(starts) if a == 0)
    out["new_ranks_alive"] = sum(alive(p) for a, _, _, p in launches(starts) if a == 1)
    if not kill:
        began = time.monotonic()
        client.cancel(urgent["id"])
        until(lambda: world_of(starts, 2) == 4)
        out["grow_back_s"] = round(time.monotonic() - began, 2)
    server.stop(client)
    client.close()
    print(f"{name}: " + ", ".join(f"{k} {v}" for k, v in out.items()))
    return {f"{name}_{k}": v for k, v in out.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", choices=("server", "tenant-users"), default="server")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="tessera-elastic-", dir="/tmp"))
    root.chmod(0o777)  # tenant users write their starts file here
    figures = {**gang(root, args.users), **elastic(root, args.users, False), **elastic(root, args.users, True)}
    print(json.dumps({"users": args.users, **figures}))


if __name__ == "__main__":
    main()
