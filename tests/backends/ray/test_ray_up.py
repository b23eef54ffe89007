"""``tessera up --backend ray`` end to end: the CLI starts a local Ray cluster on 127.0.0.1 with the ``--gpus`` pool,
says so, runs submitted workloads there (logs through ``tessera logs``, cancel with grace), and a server killed with
``kill -9`` and started again re-adopts the running workload without launching it twice."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from ray_cluster import skip_unless_loopback_only, wait_until

from tessera.backends.local_exec import package_root
from tessera.backends.ray.local_cluster import stop_local_cluster
from tessera.client.http import TesseraClient, wait_healthy

pytestmark = [pytest.mark.ray, pytest.mark.e2e]
ADMIN = "ray-e2e-admin-token-0123456789"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Up:
    """A ``tessera up --backend ray`` process on a fixed port and data directory (so a restart finds both)."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir, self.port = data_dir, free_port()
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        command = [sys.executable, "-m", "tessera.cli", "up", "--backend", "ray", "--gpus", "2xA100-80GB"]
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


@pytest.fixture
def up(tmp_path: Path) -> Iterator[Up]:
    skip_unless_loopback_only()
    server = Up(tmp_path / "data")
    server.data_dir.mkdir()
    try:
        yield server
    finally:
        server.stop(signal.SIGKILL)
        assert stop_local_cluster(server.data_dir), "the local Ray cluster's ray start process did not end"


def state(client: TesseraClient, workload_id: int) -> str:
    return str(client.workload(workload_id)["state"])


def test_tessera_up_backend_ray_end_to_end_with_a_restart(up: Up, tmp_path: Path) -> None:
    start_s = time.monotonic()
    up.start()
    print(f"tessera up --backend ray: healthy after {time.monotonic() - start_s:.1f} s (local Ray cluster started)")
    assert "started local Ray cluster at 127.0.0.1:" in up.output()
    runs = tmp_path / "runs"
    with up.client() as client:
        nodes = client.nodes()
        assert [n["name"] for n in nodes] == ["local"]
        quick = int(client.submit({"command": ["sh", "-c", "echo cvd=$CUDA_VISIBLE_DEVICES; exit 3"], "gpus": 1})["id"])
        long = f"echo $$ >> {runs}; echo up; while [ ! -e {tmp_path}/go ]; do sleep 0.1; done"
        kept = int(client.submit({"command": ["sh", "-c", long], "gpus": 1, "gpu_fraction": 0.5})["id"])
        follow = up.cli("logs", "-f", str(quick), exit_code=3)  # once it has ended: with the workload's exit code
        assert "cvd=SIM-local-A100-80GB-" in follow
        assert state(client, quick) == "failed"  # exit code 3
        wait_until(lambda: state(client, kept) == "running" and runs.exists(), 90, "the long workload to run")
    up.stop(signal.SIGKILL)  # the server dies; the workload runs on in Ray
    up.start()
    assert "joined the local Ray cluster" in up.output()
    with up.client() as client:
        assert state(client, kept) == "running"
        (tmp_path / "go").touch()
        wait_until(lambda: state(client, kept) == "succeeded", 60, "the re-adopted workload to end")
        assert "up" in up.cli("logs", str(kept))
    assert len(runs.read_text().split()) == 1  # launched once, re-adopted after the restart
