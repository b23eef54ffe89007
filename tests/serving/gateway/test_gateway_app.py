"""The gateway's request path in-process: the ASGI app behind httpx's ASGI transport, replicas faked by a mock
transport (no socket, no subprocess). The real processes are in tests/serving/test_gateway_e2e.py."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import httpx

from tessera.serving.gateway.app import Gateway, GatewayConfig
from tessera.serving.gateway.auth import StaticKeys
from tessera.serving.gateway.metrics import GatewayMetrics
from tessera.serving.gateway.registry import InMemoryRegistry, ModelRoute
from tessera.serving.gateway.upstream_httpx import HttpxUpstream

KEYS = {"key-a": "team-a", "key-b": "team-b"}
A = {"authorization": "Bearer key-a"}
CHAT = {"model": "chat-a", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


class _Body(httpx.AsyncByteStream):
    """A body read as it comes, as from a socket (a Response built with content is read at once)."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield self.data


class FakeReplicas:
    """Answers as an engine would: echoes which replica got which body; /metrics from ``running``."""

    def __init__(self) -> None:
        self.bodies: list[tuple[str, bytes]] = []
        self.running: dict[str, int] = {}
        self.down: set[str] = set()  # hosts that refuse connections
        self.asleep: set[str] = set()  # hosts whose engine sleeps (until a POST /wake_up)

    def handler(self, request: httpx.Request) -> httpx.Response:
        host = f"{request.url.host}:{request.url.port}"
        if host in self.down:
            raise httpx.ConnectError("connection refused", request=request)
        if request.url.path == "/metrics":
            text = f"vllm:num_requests_running {self.running.get(host, 0)}\n"
            text += f"tessera_sim:is_sleeping {int(host in self.asleep)}\n"
            return httpx.Response(200, text=text)
        if request.url.path == "/wake_up" and request.method == "POST":
            self.asleep.discard(host)
            return httpx.Response(200, json={})
        self.bodies.append((host, request.content))
        body = json.dumps({"served_by": host, "object": "chat.completion"}).encode()
        return httpx.Response(200, headers={"content-type": "application/json"}, stream=_Body(body))


@asynccontextmanager
async def gateway(
    config: GatewayConfig | None = None, metrics: GatewayMetrics | None = None
) -> AsyncIterator[tuple[Gateway, InMemoryRegistry, FakeReplicas, httpx.AsyncClient]]:
    registry = InMemoryRegistry()
    registry.deploy(ModelRoute("chat-a", "team-a"))
    registry.deploy(ModelRoute("chat-b", "team-b"))
    fake = FakeReplicas()
    upstream = httpx.AsyncClient(transport=httpx.MockTransport(fake.handler))
    config = config or GatewayConfig(scrape_interval_s=3600)
    app = Gateway(registry, StaticKeys(KEYS), config, HttpxUpstream(upstream), metrics)
    await app.start()
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw")
    try:
        yield app, registry, fake, client
    finally:
        await client.aclose()
        await app.close()


def run(test: Callable[[], object]) -> None:
    asyncio.run(test())  # type: ignore[arg-type]


async def _wait_until(check: Callable[[], bool], timeout_s: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not check():
        assert loop.time() < deadline, "condition not met in time"
        await asyncio.sleep(0.005)


def test_a_tenant_lists_and_uses_only_its_own_models() -> None:
    async def go() -> None:
        async with gateway() as (_, registry, fake, client):
            registry.add_replica("chat-a", "http://127.0.0.1:9001")
            registry.add_replica("chat-b", "http://127.0.0.1:9002")
            listing = (await client.get("/v1/models", headers=A)).json()
            assert [m["id"] for m in listing["data"]] == ["chat-a"] and listing["object"] == "list"
            mine = await client.post("/v1/chat/completions", json=CHAT, headers=A)
            assert mine.status_code == 200 and mine.json()["served_by"] == "127.0.0.1:9001"
            assert mine.headers["x-tessera-replica"] == "0"
            assert json.loads(fake.bodies[0][1]) == CHAT  # the client's body, forwarded unchanged
            theirs = await client.post("/v1/chat/completions", json={**CHAT, "model": "chat-b"}, headers=A)
            unknown = await client.post("/v1/chat/completions", json={**CHAT, "model": "nope"}, headers=A)
            assert theirs.status_code == unknown.status_code == 404
            assert theirs.json()["error"]["code"] == "model_not_found" and theirs.json()["error"]["param"] == "model"
            assert "chat-b" in theirs.json()["error"]["message"]  # same words as an unknown model: nothing leaks

    run(go)


def test_no_or_a_wrong_key_is_401() -> None:
    async def go() -> None:
        async with gateway() as (_, _, _, client):
            assert (await client.get("/v1/models")).status_code == 401
            wrong = await client.post("/v1/chat/completions", json=CHAT, headers={"authorization": "Bearer nope"})
            assert wrong.status_code == 401 and wrong.json()["error"]["code"] == "invalid_api_key"

    run(go)


def test_a_malformed_body_or_header_is_400_naming_the_field() -> None:
    async def go() -> None:
        async with gateway() as (_, registry, _, client):
            registry.add_replica("chat-a", "http://127.0.0.1:9001")
            no_messages = await client.post("/v1/chat/completions", json={"model": "chat-a"}, headers=A)
            assert no_messages.status_code == 400 and no_messages.json()["error"]["param"] == "messages"
            not_json = await client.post("/v1/completions", content=b"{", headers=A)
            assert not_json.status_code == 400 and not_json.json()["error"]["param"] == "body"
            slo = await client.post("/v1/chat/completions", json=CHAT, headers={**A, "x-tessera-slo": "urgent"})
            assert slo.status_code == 400 and slo.json()["error"]["param"] == "x-tessera-slo"
            assert (await client.get("/v1/chat/completions", headers=A)).status_code == 405
            assert (await client.get("/v2/x", headers=A)).status_code == 404

    run(go)


def test_a_request_for_a_model_at_zero_is_held_until_a_replica_is_ready() -> None:
    async def go() -> None:
        asked: list[str] = []
        config = GatewayConfig(scrape_interval_s=3600, on_demand=asked.append)
        async with gateway(config) as (app, registry, _, client):
            pending = asyncio.ensure_future(client.post("/v1/chat/completions", json=CHAT, headers=A))
            await _wait_until(lambda: app.hold.held("chat-a") == 1)
            assert asked == ["chat-a"] and not pending.done()
            registry.add_replica("chat-a", "http://127.0.0.1:9001")
            response = await pending
            assert response.status_code == 200 and app.hold.held("chat-a") == 0

    run(go)


def test_the_slo_header_sets_the_class_a_request_is_held_released_and_counted_under() -> None:
    async def go() -> None:
        metrics = GatewayMetrics()
        async with gateway(metrics=metrics) as (app, registry, fake, client):
            pending = []
            for slo in ("", "batch", "interactive"):  # chat-a's own class is standard
                body = {**CHAT, "messages": [{"role": "user", "content": slo or "default"}]}
                headers = {**A, "x-tessera-slo": slo} if slo else A
                pending.append(asyncio.ensure_future(client.post("/v1/chat/completions", json=body, headers=headers)))
                await _wait_until(lambda: app.hold.held("chat-a") == len(pending))
            registry.add_replica("chat-a", "http://127.0.0.1:9001")
            assert all(r.status_code == 200 for r in await asyncio.gather(*pending))
            # Released by class (interactive, standard, batch), not in the order they came.
            order = [json.loads(body)["messages"][0]["content"] for _, body in fake.bodies]
            assert order == ["interactive", "default", "batch"]
            for slo in ("interactive", "standard", "batch"):
                labels = {"served_model": "chat-a", "slo": slo, "code": "200"}
                assert metrics.registry.get_sample_value("tessera_gateway_requests_total", labels) == 1.0

    run(go)


def test_one_request_over_the_hold_bound_is_429_with_retry_after_and_a_long_hold_504() -> None:
    async def go() -> None:
        config = GatewayConfig(scrape_interval_s=3600, max_held_per_model=1, max_hold_s=0.3, retry_after_s=3)
        async with gateway(config) as (app, _, _, client):
            first = asyncio.ensure_future(client.post("/v1/chat/completions", json=CHAT, headers=A))
            await _wait_until(lambda: app.hold.held("chat-a") == 1)
            over = await client.post("/v1/chat/completions", json=CHAT, headers=A)
            assert over.status_code == 429 and over.headers["retry-after"] == "3"
            assert over.json()["error"]["type"] == "rate_limit_error"
            expired = await first
            assert expired.status_code == 504 and "held" in expired.json()["error"]["message"]

    run(go)


def test_a_model_removed_while_requests_wait_answers_them_404() -> None:
    async def go() -> None:
        async with gateway() as (app, registry, _, client):
            pending = asyncio.ensure_future(client.post("/v1/chat/completions", json=CHAT, headers=A))
            await _wait_until(lambda: app.hold.held("chat-a") == 1)
            registry.undeploy("chat-a")
            assert (await pending).status_code == 404

    run(go)


def test_the_router_avoids_the_replica_whose_metrics_say_it_is_busy() -> None:
    async def go() -> None:
        async with gateway() as (app, registry, fake, client):
            registry.add_replica("chat-a", "http://127.0.0.1:9001")
            registry.add_replica("chat-a", "http://127.0.0.1:9002")
            fake.running["127.0.0.1:9001"] = 50
            await app.replicas.scrape_once(app.upstream)
            for _ in range(3):
                response = await client.post("/v1/chat/completions", json=CHAT, headers=A)
                assert response.json()["served_by"] == "127.0.0.1:9002"

    run(go)


def test_a_replica_that_cannot_be_reached_is_skipped_and_with_none_left_the_answer_is_502() -> None:
    async def go() -> None:
        async with gateway() as (app, registry, fake, client):
            registry.add_replica("chat-a", "http://127.0.0.1:9001")
            registry.add_replica("chat-a", "http://127.0.0.1:9002")
            fake.down.add("127.0.0.1:9001")
            for _ in range(3):
                response = await client.post("/v1/chat/completions", json=CHAT, headers=A)
                assert response.status_code == 200 and response.json()["served_by"] == "127.0.0.1:9002"
            fake.down.add("127.0.0.1:9002")
            failed = await client.post("/v1/chat/completions", json=CHAT, headers=A)
            assert failed.status_code == 502 and failed.json()["error"]["code"] == "replica_unreachable"

    run(go)


def test_a_replica_found_asleep_is_woken_and_serves_again() -> None:
    """A replica put to sleep behind Tessera's back (``POST /sleep``) once held every request of its model until
    the hold's timeout, while the API showed it ready: the scrape now wakes it."""

    async def go() -> None:
        async with gateway() as (app, registry, fake, client):
            registry.add_replica("chat-a", "http://127.0.0.1:9001")
            fake.asleep.add("127.0.0.1:9001")
            await app.replicas.scrape_once(app.upstream)
            assert not fake.asleep  # woken
            await app.replicas.scrape_once(app.upstream)
            assert all(load.view().accepting for load in app.replicas.loads("chat-a"))
            response = await client.post("/v1/chat/completions", json=CHAT, headers=A)
            assert response.status_code == 200 and response.json()["served_by"] == "127.0.0.1:9001"

    run(go)


def test_a_replica_that_leaves_the_registry_has_its_connections_dropped() -> None:
    async def go() -> list[str]:
        async with gateway() as (app, registry, _, client):
            forgotten: list[str] = []
            app.upstream.forget = forgotten.append  # type: ignore[method-assign,assignment]
            first = registry.add_replica("chat-a", "http://127.0.0.1:9001")
            registry.add_replica("chat-a", "http://127.0.0.1:9002")
            assert (await client.post("/v1/chat/completions", json=CHAT, headers=A)).status_code == 200
            registry.remove_replica("chat-a", first)
            registry.undeploy("chat-a")
            return forgotten

    assert asyncio.run(go()) == ["http://127.0.0.1:9001", "http://127.0.0.1:9002"]


def test_a_failing_model_is_answered_503_at_once_with_the_reason_and_held_requests_too() -> None:
    """A model whose engine cannot start once held every request for the hold's 120 s (and answered 504 with no
    reason). A failing route is answered at once: 503, Retry-After, the last error."""

    async def go() -> None:
        async with gateway() as (app, registry, _, client):
            held = asyncio.ensure_future(client.post("/v1/chat/completions", json=CHAT, headers=A))
            await _wait_until(lambda: app.hold.held("chat-a") == 1)
            registry.deploy(ModelRoute("chat-a", "team-a", failing="exit code 1: no weights", retry_after_s=8))
            for response in (await held, await client.post("/v1/chat/completions", json=CHAT, headers=A)):
                assert response.status_code == 503 and response.headers["retry-after"] == "8"
                assert "no weights" in response.json()["error"]["message"]
                assert response.json()["error"]["code"] == "model_failing"

    run(go)
