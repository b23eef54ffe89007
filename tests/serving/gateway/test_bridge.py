"""The gateway bridge on a real event loop with in-process Unix-socket replicas: a replica is registered only once
proven (its listener is the replica's own and its /health answers), proving happens on the loop, concurrently, so a
replica that accepts and never answers holds up neither the controller's thread nor the others' registration."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import replace
from pathlib import Path

from tessera.serving.controller import ReplicaView
from tessera.serving.gateway.app import Gateway
from tessera.serving.gateway.bridge import GatewayBridge, LiveRegistry, route_of
from tessera.serving.replicas import DeployedModel
from tessera.serving.setups import serving_setup, with_setup_knobs

MODEL = DeployedModel(
    id=1, name="chat", tenant="t", queue="t", engine="sim", weights="", gpus=1, gpu_milli=250, gpu_mem_mib=0,
    min_replicas=1, max_replicas=3, idle_timeout_s=30.0, slo="standard",
)  # fmt: skip
OK = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}"


async def _replica(path: Path, answers: bool) -> asyncio.AbstractServer:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        if answers:
            writer.write(OK)
            await writer.drain()
        else:
            await asyncio.sleep(60)  # accepts, never answers
        writer.close()

    return await asyncio.start_unix_server(handle, str(path))


def test_only_proven_replicas_are_registered_and_a_hanging_one_blocks_nothing(tmp_path: Path) -> None:
    asked_on: set[str] = set()  # the threads the proof ran on

    def owns(workload_id: int, pid: int) -> bool:
        asked_on.add(threading.current_thread().name)
        return workload_id != 12  # replica 12's socket is served by a process that is not its own

    async def go() -> tuple[frozenset[tuple[int, int]], list[str]]:
        registry = LiveRegistry(lambda name: None)
        gateway = Gateway(registry)
        bridge = GatewayBridge(registry, gateway, threading.Event(), owns)
        bridge.loop = asyncio.get_running_loop()
        servers = [
            await _replica(tmp_path / "good.sock", answers=True),
            await _replica(tmp_path / "hangs.sock", answers=False),
            await _replica(tmp_path / "impostor.sock", answers=True),
        ]
        replicas = {
            1: [
                ReplicaView(10, True, f"unix:{tmp_path / 'good.sock'}"),
                ReplicaView(11, True, f"unix:{tmp_path / 'hangs.sock'}"),
                ReplicaView(12, True, f"unix:{tmp_path / 'impostor.sock'}"),
                ReplicaView(13, False, f"unix:{tmp_path / 'pending.sock'}"),
            ]
        }
        await asyncio.to_thread(bridge.publish, [MODEL], replicas)  # the controller's thread
        for _ in range(100):
            await asyncio.sleep(0.02)
            if bridge.proven:
                break
        await asyncio.sleep(0.6)  # the hanging one's proof times out meanwhile
        urls = [e.base_url for e in registry.replicas("chat")]
        for server in servers:
            server.close()
        return bridge.proven, urls

    proven, urls = asyncio.run(go())
    assert proven == frozenset({(10, 0)})
    assert urls == [f"unix:{tmp_path / 'good.sock'}"]
    assert asked_on == {threading.main_thread().name}  # proven on the gateway's loop, never the controller's thread


def test_a_route_caps_a_replicas_requests_at_the_autoscalers_target_for_its_engine() -> None:
    setup = serving_setup("tessera")
    assert route_of(MODEL, setup).replica_concurrency == 32  # sim: the controller's DEFAULT_TARGETS
    assert route_of(replace(MODEL, engine="transformers"), setup).replica_concurrency == 4
    assert route_of(replace(MODEL, engine="unknown"), setup).replica_concurrency == 0  # none: the gateway's default


def test_a_route_follows_the_serving_setup_where_its_model_sets_nothing() -> None:
    """The twin's tessera setup: the model's router unless it chose one, late binding by KV room, batch admission.
    The old live gateway (least-load, no queue): no cap, no KV room, every request admitted."""
    tessera = route_of(MODEL, serving_setup("tessera"))
    assert (tessera.router, tessera.kv_room, tessera.admission) == ("prefix-affinity", True, True)
    assert route_of(replace(MODEL, router="round-robin"), serving_setup("tessera")).router == "round-robin"
    old = route_of(MODEL, with_setup_knobs(serving_setup("static"), ["router=least-load"]))
    assert (old.router, old.replica_concurrency, old.kv_room, old.admission) == ("least-load", 0, False, False)
