"""An in-process control plane for tests: SQLite in a temp dir, a simulated GPU pool, the fake backend, a clock the
test moves by hand. No server process and no real workload process: the loop is stepped explicitly."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from tessera.backends.fake import FakeBackend
from tessera.gpu.gpus import SimulatedProbe, parse_gpu_spec
from tessera.server.auth import ensure_admin_token
from tessera.server.loop_values import LoopConfig
from tessera.server.pool import HostResources
from tessera.server.up import Server, UpConfig, build_server
from tessera.server.workload_limits import WorkloadLimits

ADMIN = "admin-secret-for-the-test-harness"  # long and varied enough for an admin token
HOST = HostResources(cpu_milli=32_000, mem_mib=128 * 1024)
# A step waits this long for the launches it decided: the tests step the loop by hand and read a step's launches
# (handles, "started" events) as soon as it returns, as the simulator's lockstep does. The server's default is short.
LOCKSTEP_S = 60.0


class FakeClock:
    def __init__(self, start_s: float = 1_000_000.0) -> None:
        self.now_s = start_s

    def __call__(self) -> float:
        return self.now_s

    def advance(self, seconds: float) -> None:
        self.now_s += seconds


@dataclass
class Harness:
    server: Server
    backend: FakeBackend
    clock: FakeClock
    http: TestClient
    db_url: str

    def step(self) -> None:
        self.server.ctx.loop.step()

    def as_(self, token: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {token}"}

    def submit(self, token: str = ADMIN, **body: object) -> dict[str, Any]:
        body.setdefault("command", ["true"])
        response = self.http.post("/v1/workloads", json=body, headers=self.as_(token))
        assert response.status_code == 201, response.text
        result: dict[str, Any] = response.json()
        return result

    def get(self, workload_id: object, token: str = ADMIN) -> dict[str, Any]:
        response = self.http.get(f"/v1/workloads/{workload_id}", headers=self.as_(token))
        assert response.status_code == 200, response.text
        result: dict[str, Any] = response.json()
        return result


MakeHarness = Callable[..., Harness]


def harness_factory(tmp_path: Path) -> tuple[MakeHarness, list[TestClient]]:
    """``make(gpus, db_url, policy, backend, placement, limits)`` builds a harness; the clients list is closed by the
    caller."""
    clients: list[TestClient] = []

    def make(
        gpus: str = "1xA100-80GB",
        db_url: str | None = None,
        policy: str = "tessera",
        backend: FakeBackend | None = None,
        placement: str | None = None,
        limits: WorkloadLimits | None = None,
        knobs: tuple[str, ...] = (),
        hosts: dict[str, str] | None = None,
        serving_setup: str = "tessera",
        serving_knobs: tuple[str, ...] = (),
    ) -> Harness:
        """``hosts``: host name -> its GPUs (``gpus`` is then ignored), for a pool of several hosts."""
        clock = FakeClock()
        backend = backend or FakeBackend()
        specs = hosts or {"local": gpus}
        devices = [d for host, spec in specs.items() for d in parse_gpu_spec(spec, node=host)]
        url = db_url or f"sqlite:///{tmp_path / 'tessera.db'}"
        config = UpConfig(
            data_dir=tmp_path,
            db_url=url,
            loop=LoopConfig(
                run_dir=tmp_path,
                policy=policy,
                placement=placement,
                knobs=knobs,
                launch_wait_s=LOCKSTEP_S,
                limits=limits or WorkloadLimits(),
            ),
            serving_setup=serving_setup,
            serving_knobs=serving_knobs,
        )
        server = build_server(config, probe=SimulatedProbe(devices), backend=backend, host=HOST, clock=clock)
        ensure_admin_token(server.ctx.store, ADMIN, clock())
        server.ctx.loop.recover()
        server.ctx.ready = True
        http = TestClient(server.app)
        clients.append(http)
        return Harness(server, backend, clock, http, url)

    return make, clients
