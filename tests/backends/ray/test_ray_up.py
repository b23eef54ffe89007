"""``tessera up --backend ray`` end to end with the CLI, on the local Ray cluster it starts on 127.0.0.1 with the
``--gpus`` pool: it says so, runs submitted workloads there (logs through ``tessera logs -f``, the exit code), and
``tessera cancel`` gives a running workload SIGTERM and its grace, ends it cancelled and leaves no process of it; the
cluster outlives the server and a server of the same data directory joins it again. (A ``kill -9`` of the server
and its restart with several workloads re-adopted, and ``--ray-address``: ``test_ray_server.py``.)"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from ray_cluster import is_running, skip_unless_loopback_only, wait_until
from tessera_up import POLITE, Up, has_state, launches, processes_of, state

from tessera.backends.ray.local_cluster import start_local_cluster, stop_local_cluster
from tessera.gpu.gpus import parse_gpu_spec

pytestmark = [pytest.mark.ray, pytest.mark.e2e]


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


def test_tessera_up_backend_ray_end_to_end_with_cancel(up: Up, tmp_path: Path) -> None:
    start_s = time.monotonic()
    up.start()
    print(f"tessera up --backend ray: healthy after {time.monotonic() - start_s:.1f} s (local Ray cluster started)")
    assert "started local Ray cluster at 127.0.0.1:" in up.output()
    runs = tmp_path / "runs"
    runs.mkdir()
    with up.client() as client:
        nodes = client.nodes()
        assert [n["name"] for n in nodes] == ["local"]
        quick = int(client.submit({"command": ["sh", "-c", "echo cvd=$CUDA_VISIBLE_DEVICES; exit 3"], "gpus": 1})["id"])
        polite = POLITE.format(d=runs, name="polite")
        cancelled = int(client.submit({"command": ["sh", "-c", polite], "gpus": 1, "gpu_fraction": 0.5})["id"])
        follow = up.cli("logs", "-f", str(quick), exit_code=3)  # once it has ended: with the workload's exit code
        assert "cvd=SIM-local-A100-80GB-" in follow
        assert state(client, quick) == "failed"  # exit code 3
        wait_until(lambda: bool(launches(runs, "polite")), 90, "the workload to cancel to start")
        processes = processes_of(runs, "polite")
        assert all(is_running(pid) for pid in processes)
        assert "stopping (running)" in up.cli("cancel", str(cancelled))
        wait_until(lambda: has_state(client, cancelled, "cancelled"), 60, "the cancelled workload to end")
        log = "".join(client.read_logs(cancelled))
        assert "got TERM" in log and "cleaned up" in log  # SIGTERM, then a second of its grace used, not cut short
        wait_until(lambda: not [p for p in processes if is_running(p)], 10, "the cancelled workload's processes to end")
        assert len(launches(runs, "polite")) == 1
    up.stop(signal.SIGKILL)  # the cluster outlives the server; the next server of this data directory joins it
    address = up.output().split("started local Ray cluster at ", 1)[1].split()[0]
    gpus = [(d.uuid, d.model) for d in parse_gpu_spec(up.gpus, node="local")]
    assert start_local_cluster(up.data_dir, gpus) == (address, False)  # what a restarted `tessera up` does first
