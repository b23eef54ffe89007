"""A real ``tessera up`` process for end-to-end tests: started on a free 127.0.0.1 port with a temp data dir and a
known admin token (in ``TESSERA_ADMIN_TOKEN``), stopped (or killed with -9, to test recovery) by the test. Workloads
run as the server's user (``--run-as server``) unless a test asks for tenant users: most tests share files with
their workloads in pytest's private temporary directories."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, TypeVar

from tessera.client.http import TesseraClient, wait_healthy

T = TypeVar("T")

ADMIN = "e2e-admin-token-0123456789"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class LiveServer:
    data_dir: Path
    gpus: str = "1xA100-80GB"
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None
    db_url: str | None = None  # None: SQLite in data_dir
    env: dict[str, str] = field(default_factory=dict)  # added to the server's environment (e.g. TESSERA_CRASH_AT)
    run_as: str = "server"
    prefix: tuple[str, ...] = ()  # e.g. setpriv ... -- to run the server as another user
    args: tuple[str, ...] = ()  # more options of tessera up (e.g. --log-max-size)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 30.0) -> None:
        command = [
            *self.prefix,
            sys.executable,
            "-m",
            "tessera.cli",
            "up",
            "--port",
            str(self.port),
            "--gpus",
            self.gpus,
            "--data-dir",
            str(self.data_dir),
            *(["--db", self.db_url] if self.db_url else []),
            "--run-as",
            self.run_as,
            *self.args,
        ]
        self.data_dir.mkdir(parents=True, exist_ok=True)
        log = (self.data_dir / "server.log").open("ab")
        env = {**os.environ, "TESSERA_ADMIN_TOKEN": ADMIN, **self.env}
        self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
        try:
            wait_healthy(self.url, timeout_s, self.process.poll)
        except (RuntimeError, TimeoutError) as error:
            raise RuntimeError(f"tessera up: {error}: {(self.data_dir / 'server.log').read_text()[-2000:]}") from None

    def client(self, token: str = ADMIN) -> TesseraClient:
        return TesseraClient(self.url, token)

    def kill_hard(self) -> None:
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=10)

    def cancel_all(self) -> None:
        """Cancel every workload still active and wait until none runs (so no process outlives the test)."""
        with self.client() as client:
            for w in client.workloads(["pending", "running"]):
                client.cancel(w["id"])
            wait_for(lambda: not client.workloads(["running"]), timeout_s=30)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def wait_for(predicate: Callable[[], T | Literal[False] | None], timeout_s: float = 20.0, interval_s: float = 0.1) -> T:
    """Poll ``predicate`` until it returns something truthy; returns it (fails the test on timeout)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout_s} s (last value {value!r})")
        time.sleep(interval_s)


def alive(pid: int) -> bool:
    """Whether ``pid`` runs and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"
