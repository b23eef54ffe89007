"""A model replica on another Ray node: ``tessera up --backend ray --ray-address`` (the CLI, its own process) on the
cluster the ``ray`` tests share (a head without GPUs, nodes ``w1`` and ``w2`` with them), a sim model deployed, its
replica placed on a GPU node and listening there on the node's address (as Ray knows it) at a port its actor picked
on that node. Requests through ``/openai`` succeed; the replica itself answers 401 to anyone without its own key
(the tenant's token included), and its key is in its environment only, never on its command line. Then the backend
alone: the address of a port workload is told only once the workload itself listens there, never while another
process holds the port."""

from __future__ import annotations

import json
import re
import signal
import socket
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from ray_cluster import wait_until
from tessera_up import ADMIN, Up

from tessera.backends.base import LaunchSpec
from tessera.backends.ray.backend import RayBackend
from tessera.serving.engine_exec import KEY_ENV

pytestmark = [pytest.mark.ray, pytest.mark.e2e]

CHAT = {"model": "chat", "messages": [{"role": "user", "content": "hello from the test"}], "max_tokens": 4}


def replica_env(up: Up, workload_id: int) -> dict[str, str]:
    """The replica workload's stored environment (read-only)."""
    with sqlite3.connect(f"file:{up.data_dir / 'tessera.db'}?mode=ro", uri=True) as db:
        (env,) = db.execute("SELECT env FROM workloads WHERE id = ?", (workload_id,)).fetchone()
    value: dict[str, str] = json.loads(env) if isinstance(env, str) else env
    return value


def processes_with(text: bytes) -> list[int]:
    """The processes whose environment holds ``text``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if text in (entry / "environ").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def test_a_replica_on_another_ray_node_serves_through_the_gateway_and_refuses_callers_without_its_key(
    shared_ray_cluster: Any, tmp_path: Path
) -> None:
    up = Up(tmp_path / "data", ray_address=shared_ray_cluster.address)
    up.data_dir.mkdir()
    base = f"http://127.0.0.1:{up.port}"
    try:
        up.start()
        with up.client() as client:
            client.deploy_model(
                {"name": "chat", "engine": "sim", "model": "llama3-8b", "gpu_fraction": 0.25, "min_replicas": 1}
            )
            answer = httpx.post(
                f"{base}/openai/v1/chat/completions",
                json=CHAT,
                headers={"authorization": f"Bearer {ADMIN}"},
                timeout=150,
            )
            assert answer.status_code == 200, answer.text
            assert answer.json()["usage"]["completion_tokens"] == 4
            [replica] = client.model("chat")["replica_workloads"]
            node = client.workload(replica)["placement"][0]["node"]
            assert node in ("w1", "w2")  # a GPU node, not the head the server joined through
            handle = up.handles()[replica]["data"]
            assert handle["node"] == node and handle["actor"] == f"tessera-{replica}"

            registered = re.search(rf"replica workload {replica} registered at (http://\S+)", up.output())
            assert registered is not None, up.output()[-3000:]
            address = registered.group(1)
            print(f"replica workload {replica} on Ray node {node} ({handle['node_id'][:12]}) at {address}")
            env = replica_env(up, replica)
            key = env[KEY_ENV]
            assert len(key) >= 32 and "--node-port" in client.workload(replica)["command"]
            engines = processes_with(f"TESSERA_SIM_API_KEY={key}".encode())
            assert engines, "no sim engine holds the replica's key"
            for pid in engines:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
                assert key.encode() not in cmdline  # readable by every user: the key is never there
                port = re.search(rb"TESSERA_LISTEN_PORT=(\d+)", Path(f"/proc/{pid}/environ").read_bytes())
                assert port is not None and address.endswith(f":{int(port.group(1))}")

            with httpx.Client(timeout=30) as direct:
                tenant = {"authorization": f"Bearer {ADMIN}"}
                refused = [
                    direct.post(f"{address}/v1/chat/completions", json=CHAT),
                    direct.post(f"{address}/v1/chat/completions", json=CHAT, headers=tenant),
                    direct.get(f"{address}/health"),
                    direct.get(f"{address}/metrics", headers={"authorization": "Bearer not-its-key"}),
                    direct.post(f"{address}/sleep"),
                ]
                assert [r.status_code for r in refused] == [401] * 5
                keyed = direct.post(
                    f"{address}/v1/chat/completions", json=CHAT, headers={"authorization": f"Bearer {key}"}
                )
                assert keyed.status_code == 200  # the same replica, with its key
            again = httpx.post(
                f"{base}/openai/v1/chat/completions",
                json=CHAT,
                headers={"authorization": f"Bearer {ADMIN}"},
                timeout=60,
            )
            assert again.status_code == 200, again.text  # its /sleep was refused: still awake, still served

            client.delete_model("chat")  # its replica ends: no actor of it is left for the tests after this one
            wait_until(lambda: client.workload(replica)["state"] == "cancelled", 60, "the replica to end")
            wait_until(lambda: not processes_with(f"TESSERA_SIM_API_KEY={key}".encode()), 30, "its engine to end")
    finally:
        up.stop(signal.SIGKILL)


# Says where it is to listen, waits for ``go``, then listens there itself.
LISTENS_AFTER_GO = (
    "echo $TESSERA_LISTEN_HOST $TESSERA_LISTEN_PORT > {d}/where; while [ ! -e {d}/go ]; do sleep 0.05; done; "
    'exec {python} -c "import os, socket, time; s = socket.socket(); '
    "s.bind((os.environ['TESSERA_LISTEN_HOST'], int(os.environ['TESSERA_LISTEN_PORT']))); s.listen(); "
    "print('listening', flush=True); time.sleep(300)\""
)


def test_a_port_on_the_node_is_told_only_once_the_workload_itself_listens_there_not_a_squatter(
    shared_ray_cluster: Any, tmp_path: Path
) -> None:
    backend = RayBackend(shared_ray_cluster.address, namespace="tessera-test-serving", node_dir=str(tmp_path / "n"))
    try:
        w2 = next(node for node in backend.inventory() if node.name == "w2")
        script = LISTENS_AFTER_GO.format(d=tmp_path, python=sys.executable)
        spec = LaunchSpec("port-1", ("sh", "-c", script), {}, tmp_path / "port-1.log", node="w2", node_port=True)
        handle = backend.launch(spec)
        where = tmp_path / "where"
        wait_until(lambda: where.exists() and len(where.read_text().split()) == 2, 60, "the workload to start")
        host, port_text = where.read_text().split()
        port = int(port_text)
        assert host == w2.address  # the node's address as Ray knows it, never a wildcard
        with socket.socket() as squatter:  # another process takes the port before the workload listens
            squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            squatter.bind((host, port))
            squatter.listen()
            deadline = time.monotonic() + 4.0
            while time.monotonic() < deadline:  # several answers of the actor come back meanwhile
                backend.poll()
                assert backend.listen_address(handle) is None
                time.sleep(0.2)
        (tmp_path / "go").touch()
        wait_until(lambda: backend.listen_address(handle) == (host, port), 60, "the workload's own listener")
        backend.stop("port-1", 0.0)
        wait_until(lambda: "port-1" in {s.workload_id for s in backend.poll()}, 60, "the workload to end")
        assert backend.listen_address(handle) is None  # ended: no address left
    finally:
        backend.shutdown()
