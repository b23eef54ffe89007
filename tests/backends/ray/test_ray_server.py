"""The whole control plane on a real local Ray cluster (a head and nodes ``w1``, ``w2`` of 2 simulated A100s each),
in process: ``build_server`` with ``--backend ray --ray-address``, its loop thread and node watch running, the API
through a test client. Nodes that join get work while the server runs; a node lost with a workload on it ends that
workload by the server's end policy, leaves no process and never runs it twice; a preemption's victim gets SIGTERM,
its grace, then SIGKILL. One server serves the module, on the cluster the ``ray`` tests share
(``shared_ray_cluster``, ``tests/conftest.py``)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from ray_cluster import add_worker, is_running, wait_until

from tessera.core.presets import PREEMPTION_MIN_RUNTIME_S
from tessera.server.auth import ensure_admin_token
from tessera.server.loop_values import LoopConfig
from tessera.server.up import Server, UpConfig, build_server, start_loop

pytestmark = pytest.mark.ray

ADMIN = "ray-server-admin-token-0123456789"
GRACE_S = 2.0
# Leaves a pid per process of it in ``{d}/{name}.pids`` (twice: a shell and a child), says "started", waits for go.
LONG = (
    "echo $$ >> {d}/{name}.pids; sleep 300 & echo $! >> {d}/{name}.pids; echo started; "
    "while [ ! -e {d}/go ]; do sleep 0.1; done; kill $!"
)


class Clock:
    """The server's wall clock, moved ahead by hand: a run is protected from priority preemption for its first
    ``PREEMPTION_MIN_RUNTIME_S`` (``core.preemption.PreemptionGuard``), which the test skips instead of waiting."""

    def __init__(self) -> None:
        self.ahead_s = 0.0

    def __call__(self) -> float:
        return time.time() + self.ahead_s


@dataclass
class Running:
    server: Server
    http: TestClient
    cluster: Any
    runs: Path
    clock: Clock

    def submit(self, **body: object) -> int:
        response = self.http.post("/v1/workloads", json=body, headers={"Authorization": f"Bearer {ADMIN}"})
        assert response.status_code == 201, response.text
        return int(response.json()["id"])

    def long(self, name: str, **body: object) -> int:
        return self.submit(command=["sh", "-c", LONG.format(d=self.runs, name=name)], **body)

    def get(self, workload_id: int) -> dict[str, Any]:
        response = self.http.get(f"/v1/workloads/{workload_id}", headers={"Authorization": f"Bearer {ADMIN}"})
        assert response.status_code == 200, response.text
        result: dict[str, Any] = response.json()
        return result

    def state(self, workload_id: int) -> str:
        return str(self.get(workload_id)["state"])

    def ended(self, workload_id: int) -> bool:
        return self.state(workload_id) not in ("running", "pending")

    def node_of(self, workload_id: int) -> str | None:
        placement = self.get(workload_id)["placement"]
        return str(placement[0]["node"]) if placement else None

    def nodes(self) -> list[str]:
        response = self.http.get("/v1/nodes", headers={"Authorization": f"Bearer {ADMIN}"})
        assert response.status_code == 200, response.text
        return sorted(str(n["name"]) for n in response.json())

    def started(self, name: str) -> bool:
        return len(self.pids(name)) == 2

    def pids(self, name: str) -> list[int]:
        path = self.runs / f"{name}.pids"
        return [int(word) for word in path.read_text().split()] if path.exists() else []

    def events(self, workload_id: int) -> list[str]:
        response = self.http.get(f"/v1/workloads/{workload_id}/events", headers={"Authorization": f"Bearer {ADMIN}"})
        assert response.status_code == 200, response.text
        return [str(e["kind"]) for e in response.json()]

    def finish(self, *ids: int) -> None:
        """Lets every waiting workload end and waits for their ends."""
        (self.runs / "go").touch()
        for workload_id in ids:
            wait_until(partial(self.ended, workload_id), 60, f"{workload_id} to end")
        (self.runs / "go").unlink()


@pytest.fixture(scope="module")
def cluster(shared_ray_cluster: Any) -> Any:
    return shared_ray_cluster


@pytest.fixture(scope="module")
def running(cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    data = tmp_path_factory.mktemp("data")
    runs = tmp_path_factory.mktemp("runs")
    loop = LoopConfig(run_dir=data, interval_s=0.1, stop_grace_s=GRACE_S)
    config = UpConfig(data_dir=data, backend="ray", ray_address=cluster.address, loop=loop)
    clock = Clock()
    server = build_server(config, clock=clock)
    ensure_admin_token(server.ctx.store, ADMIN, clock())
    thread = start_loop(server)
    try:
        with TestClient(server.app) as http:
            yield Running(server, http, cluster, runs, clock)
    finally:
        server.stopping.set()
        thread.join(timeout=30)
        for close in server.closers:
            close()
        server.backend.close()


def test_a_node_that_joins_gets_work_and_a_lost_node_ends_its_workload_once(running: Running) -> None:
    assert running.nodes() == ["w1", "w2"]  # the head declares no GPUs: not in the pool
    fillers = [running.long(f"fill-{i}", gpus=2) for i in range(2)]
    wait_until(lambda: all(running.started(f"fill-{i}") for i in range(2)), 60, "the fillers to run")
    waiting = running.long("joiner", gpus=1)
    time.sleep(1.0)
    assert running.state(waiting) == "pending"  # no room on w1, w2
    start_s = time.monotonic()
    node = add_worker(running.cluster, "w3", "1xA100-80GB", num_cpus=1)
    wait_until(lambda: running.state(waiting) == "running", 60, "the waiting workload to be placed on w3")
    print(f"node joined: its first workload running {time.monotonic() - start_s:.1f} s after ray added the node")
    assert running.node_of(waiting) == "w3"
    assert "w3" in running.nodes()
    wait_until(lambda: running.started("joiner"), 60, "the workload on w3 to start")
    pids = running.pids("joiner")

    start_s = time.monotonic()
    running.cluster.remove_node(node, allow_graceful=False)
    wait_until(lambda: running.state(waiting) == "failed", 90, "the workload of the lost node to end")
    print(f"node lost: its workload failed {time.monotonic() - start_s:.1f} s after the node was removed")
    assert running.get(waiting)["exit_code"] is None
    print(f"its end: {running.get(waiting)['reason']}")
    wait_until(lambda: not [pid for pid in pids if is_running(pid)], 10, "the lost workload's processes to end")
    wait_until(lambda: "w3" not in running.nodes(), 30, "w3 to leave the pool")
    time.sleep(2.0)
    assert running.state(waiting) == "failed" and len(running.pids("joiner")) == 2  # started once, never again
    running.finish(*fillers)
    assert {running.state(f) for f in fillers} == {"succeeded"}


def test_preemption_on_ray_gives_the_victim_sigterm_its_grace_then_sigkill(running: Running) -> None:
    stubborn = "trap 'echo got TERM' TERM; " + LONG  # ignores SIGTERM: only the SIGKILL after the grace ends it
    low = [
        running.submit(
            command=["sh", "-c", stubborn.format(d=running.runs, name=f"low-{i}")], gpus=2, priority="best-effort"
        )
        for i in range(2)
    ]
    wait_until(lambda: all(running.started(f"low-{i}") for i in range(2)), 60, "the low-priority workloads to run")
    pids = {i: running.pids(f"low-{i}") for i in range(2)}
    running.clock.ahead_s += PREEMPTION_MIN_RUNTIME_S + 1  # the low-priority runs may be preempted now
    start_s = time.monotonic()
    high = running.long("high", gpus=2, priority="inference-critical")

    def victims() -> list[int]:
        return [w for w in low if "preempted" in running.events(w)]

    wait_until(lambda: bool(victims()), 30, "a preemption")
    (victim,) = victims()
    index = low.index(victim)
    wait_until(lambda: running.state(high) == "running" and running.started("high"), 60, "the preemptor to run")
    took_s = time.monotonic() - start_s
    print(f"preemption: the preemptor ran {took_s:.1f} s after it was submitted (grace {GRACE_S} s)")
    assert took_s >= GRACE_S  # the victim had its grace: it ignored SIGTERM, so only the SIGKILL ended it
    log = (running.server.ctx.loop.log_path(victim)).read_text()
    assert "got TERM" in log
    assert not [pid for pid in pids[index] if is_running(pid)]  # its whole group was killed
    assert running.state(victim) == "pending"  # requeued (the server's policy for a preempted workload)
    other = low[1 - index]
    assert running.state(other) == "running"
    running.finish(high, other)
    wait_until(lambda: running.state(victim) != "pending", 60, "the requeued victim to run again")
    running.finish(victim)
    assert running.get(victim)["attempts"] == 2
