"""A single-host Ray cluster for a trial: ``tessera up --backend ray`` without ``--ray-address``.

Starts ``ray start --head --block`` on 127.0.0.1 with Ray's own GPUs at 0 and the GPUs of ``--gpus SPEC`` declared
as Tessera's per-GPU resources (``nodes.py``), in a session of its own, so that workloads survive a restart of the
server, which then finds the same cluster again (its address and the ``ray start`` process id are kept in
``<data dir>/ray/``). ``stop_local_cluster`` sends that process SIGTERM, on which Ray stops every process it started.
Ray replaces 127.0.0.1 by the machine's interface address when the host has one: run it inside a loopback-only
network namespace where that matters (``unshare --net``; see docs/ray.md).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from tessera.backends.local_exec import package_root
from tessera.backends.ray.nodes import start_arguments
from tessera.core.errors import TesseraError

logger = logging.getLogger(__name__)

HOST = "127.0.0.1"
NODE_NAME = "local"  # as the local GPU pool names this host
START_TIMEOUT_S = 120.0


def ray_command() -> str:
    """The ``ray`` program of this Python's environment (else the one on PATH)."""
    beside = Path(sys.executable).with_name("ray")
    found = str(beside) if beside.exists() else shutil.which("ray")
    if found is None:
        raise TesseraError("the ray command is missing: pip install 'tessera[ray]'")
    return found


def temp_dir(data_dir: Path) -> Path:
    """Ray's session directory for this data directory: short, because Ray puts UNIX sockets in it."""
    digest = hashlib.sha256(str(data_dir.absolute()).encode()).hexdigest()[:10]
    return Path("/tmp") / f"tessera-ray-{digest}"


def answers(address: str) -> bool:
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=1.0):
            return True
    except (OSError, ValueError):
        return False


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        return int(probe.getsockname()[1])


def start_local_cluster(data_dir: Path, gpus: Sequence[tuple[str, str]]) -> tuple[str, bool]:
    """(address, started): the local cluster this data directory started earlier if it still answers, else a new
    head on 127.0.0.1 with ``gpus`` (UUID, model) declared. ``TesseraError`` when ``ray start`` fails."""
    directory = data_dir / "ray"
    record = directory / "address"
    if record.exists():
        address = record.read_text().strip()
        if answers(address):
            logger.info("the local Ray cluster at %s is up: joining it", address)
            return address, False
    tmp = temp_dir(data_dir)
    tmp.mkdir(mode=0o700, parents=True, exist_ok=True)
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    port = free_port()
    command = [ray_command(), "start", "--head", "--block", "--node-ip-address", HOST, "--port", str(port)]
    command += ["--include-dashboard", "false", "--disable-usage-stats", "--temp-dir", str(tmp)]
    command += start_arguments(NODE_NAME, gpus)
    env = {**os.environ, "RAY_TMPDIR": str(tmp), "PYTHONPATH": package_root(), "RAY_USAGE_STATS_ENABLED": "0"}
    with open(directory / "ray-start.log", "ab") as log:
        head = subprocess.Popen(
            command, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log, cwd="/", start_new_session=True
        )  # outlives the server: the workloads run in it
    (directory / "pid").write_text(f"{head.pid}\n")
    address = f"{HOST}:{port}"
    deadline_s = time.monotonic() + START_TIMEOUT_S
    while not answers(address):
        if head.poll() is not None or time.monotonic() > deadline_s:
            head.kill()
            tail = (directory / "ray-start.log").read_text(errors="replace").strip().splitlines()[-1:] or ["no output"]
            raise TesseraError(f"ray start failed: {tail[0]}")
        time.sleep(0.2)
    record.write_text(address + "\n")
    return address, True


def stop_local_cluster(data_dir: Path, timeout_s: float = 60.0) -> bool:
    """SIGTERM to the ``ray start --block`` process this data directory started (it stops what it started); True
    once it has ended, False when there was none."""
    try:
        pid = int((data_dir / "ray" / "pid").read_text())
    except (OSError, ValueError):
        return False
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    deadline_s = time.monotonic() + timeout_s
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline_s:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)  # our child when this process started it
        time.sleep(0.1)
    return not Path(f"/proc/{pid}").exists()
