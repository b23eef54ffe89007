"""A replica on a TCP port of another node (the Ray backend) requires its own key: the gateway proves it with that
key, sends it as ``Authorization: Bearer`` on every request, scrape and wake-up, and never passes the client's own
token on. Real sim engine handlers on 127.0.0.1 (in process), the real upstream client, the gateway's ASGI app."""

from __future__ import annotations

import asyncio
import threading

import httpx

from tessera.serving.controller import ReplicaView
from tessera.serving.engines.http_lite import HttpConnection, HttpRequest, serve
from tessera.serving.engines.sim_api import SimApi, SimSettings
from tessera.serving.engines.sim_live import LiveEngine
from tessera.serving.gateway.app import Gateway, GatewayConfig
from tessera.serving.gateway.auth import StaticKeys
from tessera.serving.gateway.bridge import GatewayBridge, LiveRegistry
from tessera.serving.gateway.replica_probe import prove_replica
from tessera.serving.gateway.upstream import RawUpstream
from tessera.serving.policies.engine_parts import EngineConfig
from tessera.serving.replicas import DeployedModel

MODEL = DeployedModel(
    id=1, name="chat", tenant="t", queue="t", engine="sim", weights="", gpus=1, gpu_milli=250, gpu_mem_mib=0,
    min_replicas=1, max_replicas=3, idle_timeout_s=30.0, slo="standard",
)  # fmt: skip
KEY = "the-replicas-own-key-0123456789abcdef"
TENANT_TOKEN = "tenant-token-never-sent-upstream"
CHAT = {"model": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


class ConstantTimes:
    def iteration_s(self, prefill_tokens: int, decode_batch: int, kv_tokens: int) -> float:
        return 0.001

    def decode_affine(self, decode_batch: int) -> tuple[float, float]:
        return 0.001, 0.0


class KeyedSim:
    """The sim engine's handler requiring ``key``, recording each request's (path, headers) first."""

    def __init__(self, key: str) -> None:
        live = LiveEngine(EngineConfig(kv_blocks=1000), ConstantTimes())
        self.api = SimApi(SimSettings("chat", max_model_len=4096, default_output_tokens=2, api_key=key), live)
        self.seen: list[tuple[str, dict[str, str]]] = []

    def __call__(self, request: HttpRequest, conn: HttpConnection) -> None:
        self.seen.append((request.path, dict(request.headers)))
        self.api(request, conn)


async def _serve(handler: KeyedSim) -> tuple[asyncio.Server, str]:
    server = await serve(handler, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"


async def _until(check: object, timeout_s: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not check():  # type: ignore[operator]
        assert loop.time() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


def test_the_probe_sends_the_replicas_key_and_a_replica_that_refuses_it_is_not_ready() -> None:
    async def go() -> None:
        sim = KeyedSim(KEY)
        server, url = await _serve(sim)
        async with server:
            without = await prove_replica(url, lambda pid: False, 2.0)
            wrong = await prove_replica(url, lambda pid: False, 2.0, "not-the-key")
            right = await prove_replica(url, lambda pid: False, 2.0, KEY)
        assert not without.ready and "401" in without.reason
        assert not wrong.ready and "401" in wrong.reason
        assert right.ready and right.listener_pid is None  # TCP: no peer credential, the key is the proof
        assert [h.get("authorization") for _, h in sim.seen] == [None, "Bearer not-the-key", f"Bearer {KEY}"]

    asyncio.run(go())


def test_a_replica_with_a_key_is_registered_with_it_and_every_gateway_request_carries_it_not_the_clients() -> None:
    async def go() -> None:
        good, stale = KeyedSim(KEY), KeyedSim("a-key-this-replica-was-never-given")
        (good_server, good_url), (stale_server, stale_url) = await _serve(good), await _serve(stale)
        registry = LiveRegistry(lambda name: None)
        gateway = Gateway(registry, StaticKeys({TENANT_TOKEN: "t"}), GatewayConfig(scrape_interval_s=3600))
        bridge = GatewayBridge(registry, gateway, threading.Event(), lambda workload_id, pid: False)
        bridge.loop = asyncio.get_running_loop()
        await gateway.start()
        client = httpx.AsyncClient(transport=httpx.ASGITransport(app=gateway), base_url="http://gw")
        try:
            views = [ReplicaView(20, True, good_url, api_key=KEY), ReplicaView(21, True, stale_url, api_key=KEY)]
            assert KEY not in repr(views)  # the key stays out of logs that print a view
            bridge.publish([MODEL], {1: views})
            await _until(lambda: bridge.proven == {(20, 0)})
            await asyncio.sleep(0.3)  # the stale one's proof has come back refused meanwhile
            assert bridge.proven == {(20, 0)}
            [endpoint] = registry.replicas("chat")
            assert endpoint.base_url == good_url and endpoint.api_key == KEY and KEY not in repr(endpoint)
            headers = {"authorization": f"Bearer {TENANT_TOKEN}", "x-client-header": "kept-at-the-gateway"}
            answer = await client.post("/v1/chat/completions", json=CHAT, headers=headers)
            streamed = await client.post("/v1/chat/completions", json={**CHAT, "stream": True}, headers=headers)
            await gateway.replicas.scrape_once(gateway.upstream)
            [load] = gateway.replicas.loads("chat")
            async with httpx.AsyncClient() as plain:
                direct = await plain.post(f"{good_url}/v1/chat/completions", json=CHAT, headers=headers)
        finally:
            await client.aclose()
            await gateway.close()
            good_server.close()
            stale_server.close()
        assert answer.status_code == 200 and streamed.status_code == 200, answer.text
        assert load.scrape_failures == 0  # /metrics read with the key
        paths = [path for path, _ in good.seen]
        assert paths[0] == "/health" and paths.count("/v1/chat/completions") == 3 and "/metrics" in paths
        gateway_requests = good.seen[:-1]  # all but the client's direct call
        assert all(h.get("authorization") == f"Bearer {KEY}" for _, h in gateway_requests)
        assert all("x-client-header" not in h for _, h in gateway_requests)
        assert direct.status_code == 401  # the client's token opens nothing at the replica itself
        assert [h.get("authorization") for path, h in stale.seen] == [f"Bearer {KEY}"]  # its probe only: 401

    asyncio.run(go())


def test_the_raw_upstream_puts_the_key_in_the_head_only_when_given() -> None:
    async def go() -> None:
        heads: list[bytes] = []

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            while True:
                try:
                    heads.append(await reader.readuntil(b"\r\n\r\n"))
                except asyncio.IncompleteReadError:
                    break
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
                await writer.drain()
            writer.close()

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        upstream = RawUpstream()
        async with server:
            await upstream.call("GET", url, "/metrics", api_key=KEY)
            await upstream.call("GET", url, "/metrics")
            response = await upstream.post(url, "/v1/completions", b"{}", None, KEY)
            await response.close()
            await upstream.aclose()
        assert [h.count(f"authorization: Bearer {KEY}\r\n".encode()) for h in heads] == [1, 0, 1]
        assert b"authorization" not in heads[1]

    asyncio.run(go())
