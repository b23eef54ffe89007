"""A ``tessera up --backend ray`` server process for the ``ray`` tests, driven through its CLI and API, and a workload
that shows its launches, its grace and what is left of it.

``Up`` runs the server on a fixed port and data directory (so a restart after ``kill -9`` finds both), on a local
Ray cluster it starts itself (``ray_address=None``, ``--gpus``) or on an existing one (``--ray-address``).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

from tessera.backends.local_exec import package_root
from tessera.client.http import TesseraClient, wait_healthy

ADMIN = "ray-e2e-admin-token-0123456789"

# Appends "SHELL SUPERVISOR CHILD" (its pids) to {d}/{name}.start when it starts, one line per launch, so a second
# launch would show; keeps a child that ignores SIGTERM (only the kill of what is left once the shell has ended stops
# it); on SIGTERM says so, takes a second of its grace and exits 0 (a SIGKILL at once would cut "cleaned up").
POLITE = (
    "trap 'echo got TERM; sleep 1; echo cleaned up; exit 0' TERM; "
    "sh -c \"trap '' TERM; exec sleep 300\" & "
    "echo $$ $PPID $! >> {d}/{name}.start; echo started; "
    "while true; do sleep 0.1; done"
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Up:
    """A ``tessera up --backend ray`` process; ``start`` again after ``stop`` restarts it on the same store."""

    def __init__(self, data_dir: Path, ray_address: str | None = None, gpus: str = "2xA100-80GB") -> None:
        self.data_dir, self.port, self.ray_address, self.gpus = data_dir, free_port(), ray_address, gpus
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        command = [sys.executable, "-m", "tessera.cli", "up", "--backend", "ray"]
        command += ["--gpus", self.gpus] if self.ray_address is None else ["--ray-address", self.ray_address]
        command += ["--port", str(self.port), "--data-dir", str(self.data_dir), "--run-as", "server"]
        env = {**os.environ, "TESSERA_ADMIN_TOKEN": ADMIN, "PYTHONPATH": package_root()}
        with (self.data_dir / "server.log").open("ab") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            wait_healthy(f"http://127.0.0.1:{self.port}", 120.0, self.process.poll)
        except (RuntimeError, TimeoutError) as error:
            raise AssertionError(f"{error}: {self.output()[-3000:]}") from None

    def output(self) -> str:
        return (self.data_dir / "server.log").read_text()

    def cli(self, *args: str, exit_code: int = 0) -> str:
        """``tessera ARGS`` against this server, which must exit with ``exit_code``; its standard output."""
        env = {**os.environ, "TESSERA_URL": f"http://127.0.0.1:{self.port}", "TESSERA_TOKEN": ADMIN}
        command = [sys.executable, "-m", "tessera.cli", *args]
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == exit_code, (done.returncode, done.stderr)
        return done.stdout

    def client(self) -> TesseraClient:
        return TesseraClient(f"http://127.0.0.1:{self.port}", ADMIN)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(sig)
            self.process.wait(timeout=30)

    def handles(self) -> dict[int, Any]:
        """The backend handles in the store (read-only), by workload id."""
        with sqlite3.connect(f"file:{self.data_dir / 'tessera.db'}?mode=ro", uri=True) as db:
            rows = db.execute("SELECT id, handle FROM workloads").fetchall()
        return {int(i): json.loads(h) if isinstance(h, str) else h for i, h in rows}


def state(client: TesseraClient, workload_id: int) -> str:
    return str(client.workload(workload_id)["state"])


def has_state(client: TesseraClient, workload_id: int, wanted: str) -> bool:
    return state(client, workload_id) == wanted


def launches(runs: Path, name: str) -> list[list[int]]:
    """The start lines of ``POLITE`` workload ``name``: one per launch, each [shell, supervisor, child]."""
    path = runs / f"{name}.start"
    return [[int(w) for w in line.split()] for line in path.read_text().splitlines()] if path.exists() else []


def parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def processes_of(runs: Path, name: str) -> list[int]:
    """Every process of the running ``POLITE`` workload ``name``: its shell, the child that ignores SIGTERM, the
    supervisor and the guard above it (the supervisor's parent)."""
    (shell, supervisor, child), *_ = launches(runs, name)
    guard = parent_of(supervisor)
    assert b"tessera.backends.ray.guard" in Path(f"/proc/{guard}/cmdline").read_bytes(), "not under its guard?"
    return [shell, child, supervisor, guard]
