"""The whole control plane on a real local Ray cluster (a head and nodes ``w1``, ``w2`` of 2 simulated A100s each).

First, ``tessera up --backend ray --ray-address`` as its own process, driven with the CLI: several workloads outlive
a ``kill -9`` of the server, are re-adopted by the restarted one and never launched twice, and ``tessera cancel``
then ends them with their grace and leaves nothing. Then the server in process: ``build_server`` with ``--backend
ray --ray-address``, its loop thread and node watch running, the API through a test client. Nodes that join get work
while the server runs; a node lost with a workload on it ends that workload by the server's end policy, leaves no
process and never runs it twice; a gang placed across both nodes runs as one workload; a preemption's victim gets
SIGTERM, its grace, then SIGKILL. The two servers use the cluster the ``ray`` tests share (``shared_ray_cluster``,
``tests/conftest.py``) one after the other, in file order (the in-process one is made at its first use)."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from ray_cluster import add_worker, is_running, wait_until
from tessera_up import POLITE, Up, has_state, launches, processes_of

from tessera.backends.base import rank_log_path
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
    """The in-process server, made at its first use: after the ``tessera up`` process test (first in this file), so
    the two servers never share the cluster (same namespace, same workload ids)."""
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


def test_tessera_up_ray_address_readopts_every_workload_after_kill_9_then_cancel_leaves_nothing(
    cluster: Any, tmp_path: Path
) -> None:
    """``tessera up --backend ray --ray-address`` (the CLI, its own process) on this cluster: three workloads on
    three GPUs of both nodes outlive a ``kill -9`` of the server; the restarted server re-adopts each (same handle,
    same processes, attempts 1, launched once), and ``tessera cancel`` then ends them with SIGTERM and their grace,
    leaving no process (an end is reported only once its actor has gone)."""
    up = Up(tmp_path / "data", ray_address=cluster.address)
    up.data_dir.mkdir()
    runs = tmp_path / "runs"
    runs.mkdir()
    names = ("r0", "r1", "r2")
    try:
        start_s = time.monotonic()
        up.start()
        print(f"tessera up --ray-address: healthy after {time.monotonic() - start_s:.1f} s")
        assert f"backend: Ray; joined the Ray cluster at {cluster.address}" in up.output()
        with up.client() as client:
            assert sorted(n["name"] for n in client.nodes()) == ["w1", "w2"]
            ids = {
                n: int(client.submit({"command": ["sh", "-c", POLITE.format(d=runs, name=n)], "gpus": 1})["id"])
                for n in names
            }
            wait_until(lambda: all(launches(runs, n) for n in names), 90, "the three workloads to start")
            placed = {(p["node"], p["uuids"][0]) for i in ids.values() for p in client.workload(i)["placement"]}
            assert len(placed) == 3 and {node for node, _ in placed} == {"w1", "w2"}  # three GPUs, both nodes
        processes = {n: processes_of(runs, n) for n in names}
        handles = up.handles()
        assert {handles[i]["data"]["actor"] for i in ids.values()} == {f"tessera-{i}" for i in ids.values()}

        up.stop(signal.SIGKILL)  # the server dies; the workloads run on in Ray
        assert all(is_running(pid) for pids in processes.values() for pid in pids)
        start_s = time.monotonic()
        up.start()
        print(f"tessera up --ray-address: restarted, healthy after {time.monotonic() - start_s:.1f} s")
        with up.client() as client:
            for workload_id in ids.values():
                workload = client.workload(workload_id)
                assert (workload["state"], workload["attempts"]) == ("running", 1)
            adopted = [f"adopted {i} (actor tessera-{i})" for i in ids.values()]
            wait_until(lambda: all(line in up.output() for line in adopted), 30, "the server to say it adopted each")
            assert up.handles() == handles  # re-adopted by the stored handles, none replaced
            assert all(is_running(pid) for pids in processes.values() for pid in pids)  # the same processes

            said = up.cli("cancel", *(str(i) for i in ids.values()))
            assert said.count("stopping (running)") == 3
            for name, workload_id in ids.items():
                wait_until(partial(has_state, client, workload_id, "cancelled"), 60, f"{name} to end cancelled")
                log = "".join(client.read_logs(workload_id))
                assert "got TERM" in log and "cleaned up" in log  # SIGTERM, then its grace
        every = [pid for pids in processes.values() for pid in pids]
        wait_until(lambda: not [pid for pid in every if is_running(pid)], 10, "no process of them left")
        assert all(len(launches(runs, name)) == 1 for name in names)  # none launched twice
    finally:
        up.stop(signal.SIGKILL)


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


def test_a_gang_placed_across_both_nodes_runs_as_one_workload(running: Running) -> None:
    """3 workers of 1 GPU do not fit one node of 2: the core places them on ``w1`` and ``w2``, the launcher makes one
    launch with a part (``gang_parts``), and the Ray backend runs every rank with one master, as one workload."""
    says = 'echo "rank=$RANK world=$WORLD_SIZE addr=$MASTER_ADDR port=$MASTER_PORT"'
    gang = running.submit(
        command=["sh", "-c", f"{says}; while [ ! -e {running.runs}/go ]; do sleep 0.1; done"], gpus=1, workers=3
    )
    logs = [rank_log_path(running.server.ctx.loop.log_path(gang), rank) for rank in range(3)]
    wait_until(lambda: all(p.exists() and "rank=" in p.read_text() for p in logs), 90, "every rank to run")
    assert sorted({str(p["node"]) for p in running.get(gang)["placement"]}) == ["w1", "w2"]
    running.finish(gang)
    assert running.state(gang) == "succeeded"
    texts = [path.read_text() for path in logs]
    masters = {text.split("addr=")[1].split()[0] + ":" + text.split("port=")[1].split()[0] for text in texts}
    assert all(f"rank={rank} world=3 " in text for rank, text in enumerate(texts)) and len(masters) == 1, texts


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
