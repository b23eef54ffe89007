"""Issue 25, defects 5 and 8, with real processes. A real ``tessera up`` whose launch worker cannot start a thread once
(``TESSERA_FAIL_AT=launch-submit:2``, as on a host out of threads) goes on launching. A job that ends before its
handle is stored, in a server killed before its next commit, is found by the restarted server, recorded as ended and
never run a second time.

For the second, the control plane runs in process (stepped by hand, as in ``server_harness``) over the real local
backend. The only test seam is ``HeldLaunch``: its launch starts the job and then holds its return until the job has
ended and the backend has reported that end, the window in which a loaded host (or one out of threads) leaves a
launch's handle unstored. The crash is the server abandoned there and a new one started on the same store and run
directory.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from live_server import LiveServer, wait_for
from server_harness import ADMIN, HOST, FakeClock

from tessera.backends.base import Handle, LaunchSpec
from tessera.backends.local import LocalBackend
from tessera.faults import FAIL_ENV
from tessera.gpu.gpus import SimulatedProbe, parse_gpu_spec
from tessera.server.auth import ensure_admin_token
from tessera.server.loop_values import LoopConfig
from tessera.server.up import Server, UpConfig, build_server

pytestmark = pytest.mark.e2e

TIMEOUT_S = 30.0


class HeldLaunch(LocalBackend):
    """The local backend, except that a launch of a workload in ``held`` returns only once ``gate`` opens."""

    def __init__(self, run_dir: Path) -> None:
        super().__init__(run_dir)
        self.held: set[str] = set()
        self.gate = threading.Event()
        self.launches: list[str] = []

    def launch(self, spec: LaunchSpec) -> Handle:
        self.launches.append(spec.workload_id)
        handle = super().launch(spec)
        if spec.workload_id in self.held:
            assert self.gate.wait(TIMEOUT_S), "the test never opened the gate"
        return handle


def _server(data: Path, backend: LocalBackend) -> Server:
    loop = LoopConfig(run_dir=data, launch_wait_s=0.0)
    config = UpConfig(data_dir=data, db_url=f"sqlite:///{data / 'tessera.db'}", loop=loop)
    server = build_server(
        config, probe=SimulatedProbe(parse_gpu_spec("1xA100-80GB")), backend=backend, host=HOST, clock=FakeClock()
    )
    server.ctx.loop.recover()
    return server


def _until(condition: Callable[[], bool], step: Callable[[], object]) -> None:
    deadline_s = time.monotonic() + TIMEOUT_S
    while not condition():
        assert time.monotonic() < deadline_s, "not reached in time"
        step()
        time.sleep(0.05)


def test_a_job_that_ended_before_its_handle_was_stored_runs_once_across_a_crash(tmp_path: Path) -> None:
    data, marker = tmp_path / "data", tmp_path / "runs.txt"
    data.mkdir()
    backend = HeldLaunch(data / "runs")
    first = _server(data, backend)
    store = first.ctx.store
    wid = _submit(first, ["sh", "-c", f"echo ran >> {marker}"])
    backend.held.add(str(wid))
    try:
        first.ctx.loop.step()  # bound and stored; the launch started the job and holds its handle
        _until(lambda: marker.exists() and str(wid) not in backend.tracked(), first.ctx.loop.step)
        row = store.get_workload(wid)
        assert row is not None and row.state == "running" and row.handle is None  # the end is only in memory
        backend.close()  # the server is killed here
    finally:
        backend.gate.set()

    restarted = HeldLaunch(data / "runs")
    second = _server(data, restarted)
    _until(lambda: _state(second, wid) != "running", second.ctx.loop.step)
    runs = marker.read_text().split()
    assert runs == ["ran"], f"the job ran {len(runs)} times"
    assert restarted.launches == [] and _state(second, wid) == "succeeded"
    restarted.close()


def _submit(server: Server, command: list[str]) -> int:
    ensure_admin_token(server.ctx.store, ADMIN, server.ctx.clock())
    server.ctx.ready = True
    http = TestClient(server.app)  # no lifespan: the loop is stepped by the test
    try:
        body = {"command": command, "gpus": 1}
        response = http.post("/v1/workloads", json=body, headers={"Authorization": f"Bearer {ADMIN}"})
    finally:
        http.close()
    assert response.status_code == 201, response.text
    return int(response.json()["id"])


def _state(server: Server, wid: int) -> str:
    row = server.ctx.store.get_workload(wid)
    assert row is not None
    return str(row.state)


def test_tessera_up_launches_on_after_its_launch_worker_could_not_start_a_thread(tmp_path: Path) -> None:
    marker = tmp_path / "runs.txt"
    live = LiveServer(tmp_path / "data", env={FAIL_ENV: "launch-submit:2"})  # the second thread the worker starts
    live.start(TIMEOUT_S * 3)
    try:
        with live.client() as client:
            ids = []
            for name in ("first", "second", "third"):  # one after the other: each launch starts a worker thread
                command = ["sh", "-c", f"echo {name} >> {marker}"]
                ids.append(int(client.submit({"command": command, "name": name, "gpus": 1})["id"]))
                wait_for(lambda: client.workload(ids[-1])["state"] not in ("pending", "running"), timeout_s=TIMEOUT_S)
            states = [client.workload(wid)["state"] for wid in ids]
    finally:
        live.stop()
    log = (live.data_dir / "server.log").read_text()
    assert f"{FAIL_ENV}: failing at launch-submit" in log  # the fault was injected, at the second launch
    assert states == ["succeeded"] * 3, log[-3000:]
    assert sorted(marker.read_text().split()) == ["first", "second", "third"]  # each ran once
