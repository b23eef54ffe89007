"""The gateway's request path in-process: the ASGI app behind httpx's ASGI transport, replicas faked by a mock
transport (no socket, no subprocess). The real processes are in tests/serving/test_gateway_e2e.py."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

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
    """A body read as it comes, as from a socket (a Response built with content is read at once): after ``gate``
    opens, if one is given; ``dies`` "before" its first byte or "after" it, as a replica killed there would."""

    def __init__(self, data: bytes, gate: asyncio.Event | None = None, dies: str = "", done: Any = None) -> None:
        self.data, self.gate, self.dies, self.done = data, gate, dies, done

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            if self.gate is not None:
                await self.gate.wait()
            if self.dies == "before":
                raise httpx.RemoteProtocolError("peer closed connection without sending complete message body")
            if self.dies == "after":
                yield self.data[:5]
                raise httpx.ReadError("connection reset by peer")
            yield self.data
        finally:
            if self.done is not None:
                self.done()


class FakeReplicas:
    """Answers as an engine would: echoes which replica got which body; /metrics from ``running``."""

    def __init__(self) -> None:
        self.bodies: list[tuple[str, bytes]] = []
        self.running: dict[str, int] = {}
        self.down: set[str] = set()  # hosts that refuse connections
        self.asleep: set[str] = set()  # hosts whose engine sleeps (until a POST /wake_up)
        self.dies: dict[str, str] = {}  # host -> "before" or "after" the first byte of an answer
        self.gate: asyncio.Event | None = None  # answers wait for it (requests stay in flight meanwhile)
        self.attempts: list[str] = []  # hosts asked for an answer, in order (the refused ones too)
        self.in_flight: dict[str, int] = {}
        self.peak: dict[str, int] = {}  # the most answers a host had in flight at once

    def handler(self, request: httpx.Request) -> httpx.Response:
        host = f"{request.url.host}:{request.url.port}"
        if request.url.path not in ("/metrics", "/wake_up"):
            self.attempts.append(host)
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
        self.in_flight[host] = self.in_flight.get(host, 0) + 1
        self.peak[host] = max(self.peak.get(host, 0), self.in_flight[host])

        def done() -> None:
            self.in_flight[host] -= 1

        body = json.dumps({"served_by": host, "object": "chat.completion"}).encode()
        stream = _Body(body, self.gate, self.dies.get(host, ""), done)
        return httpx.Response(200, headers={"content-type": "application/json"}, stream=stream)


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


def test_a_replica_that_cannot_be_reached_is_skipped_and_with_none_left_in_time_the_answer_is_502() -> None:
    async def go() -> None:
        async with gateway(GatewayConfig(scrape_interval_s=3600, max_hold_s=0.5)) as (app, registry, fake, client):
            registry.add_replica("chat-a", "http://127.0.0.1:9001")
            registry.add_replica("chat-a", "http://127.0.0.1:9002")
            fake.down.add("127.0.0.1:9001")
            for _ in range(3):
                response = await client.post("/v1/chat/completions", json=CHAT, headers=A)
                assert response.status_code == 200 and response.json()["served_by"] == "127.0.0.1:9002"
            fake.down.add("127.0.0.1:9002")
            fake.attempts.clear()
            failed = await client.post("/v1/chat/completions", json=CHAT, headers=A)
            assert failed.status_code == 502 and failed.json()["error"]["code"] == "replica_unreachable"
            # Held for another replica until its deadline, and never sent twice to a replica found gone.
            assert sorted(fake.attempts) == sorted(set(fake.attempts)) and app.hold.total() == 0

    run(go)


def test_a_replica_gone_before_the_first_byte_is_retried_on_another_and_counted_after_it_the_answer_ends() -> None:
    """Two requests sent just after a replica was killed -9 once got 502 in 1-1.5 s. A replica whose answer
    breaks off before its first byte reached the client now costs the client nothing: the request goes to another
    replica (the engine's work may be done twice). Once a byte was sent, the answer ends as before."""

    async def go() -> None:
        metrics = GatewayMetrics()
        async with gateway(metrics=metrics) as (_, registry, fake, client):
            registry.add_replica("chat-a", "http://127.0.0.1:9001")  # the router's first choice (ties: lowest id)
            registry.add_replica("chat-a", "http://127.0.0.1:9002")
            fake.dies["127.0.0.1:9001"] = "before"
            response = await client.post("/v1/chat/completions", json=CHAT, headers=A)
            assert response.status_code == 200 and response.json()["served_by"] == "127.0.0.1:9002"
            assert fake.attempts == ["127.0.0.1:9001", "127.0.0.1:9002"]
            labels = {"served_model": "chat-a", "slo": "standard"}
            assert metrics.registry.get_sample_value("tessera_gateway_retries_total", labels) == 1.0

            fake.dies = {"127.0.0.1:9002": "after"}
            fake.attempts.clear()
            streamed = await client.post("/v1/chat/completions", json={**CHAT, "stream": True}, headers=A)
            assert streamed.status_code == 200 and "replica_failed" in streamed.text  # ended, saying so
            assert fake.attempts == ["127.0.0.1:9002"]  # 9001 is left alone a second; no retry after a byte
            assert metrics.registry.get_sample_value("tessera_gateway_retries_total", labels) == 1.0

    run(go)


def test_a_request_whose_only_replica_is_gone_is_held_until_another_is_ready() -> None:
    async def go() -> None:
        async with gateway() as (app, registry, fake, client):
            dead = registry.add_replica("chat-a", "http://127.0.0.1:9001")
            fake.dies["127.0.0.1:9001"] = "before"
            pending = asyncio.ensure_future(client.post("/v1/chat/completions", json=CHAT, headers=A))
            await _wait_until(lambda: app.hold.held("chat-a") == 1)
            await asyncio.sleep(1.2)  # past the dead replica's back-off: still not sent there again
            assert not pending.done() and fake.attempts == ["127.0.0.1:9001"]
            registry.remove_replica("chat-a", dead)
            registry.add_replica("chat-a", "http://127.0.0.1:9003")  # its replacement
            response = await pending
            assert response.status_code == 200 and response.json()["served_by"] == "127.0.0.1:9003"

    run(go)


def test_a_burst_held_from_zero_is_spread_over_replicas_as_each_becomes_ready_within_their_cap() -> None:
    """100 requests held while a model started once all went to its first ready replica, and two others sat idle.
    Held requests are now bound as replicas have room (here 2 in flight each): the rest wait for the next replica
    or for room."""

    async def go() -> None:
        async with gateway(GatewayConfig(scrape_interval_s=3600, replica_concurrency=2)) as (
            app,
            registry,
            fake,
            client,
        ):
            fake.gate = asyncio.Event()
            pending = [
                asyncio.ensure_future(client.post("/v1/chat/completions", json=CHAT, headers=A)) for _ in range(7)
            ]
            await _wait_until(lambda: app.hold.held("chat-a") == 7)
            for port, left in ((9001, 5), (9002, 3), (9003, 1)):
                registry.add_replica("chat-a", f"http://127.0.0.1:{port}")
                await _wait_until(lambda left=left: sum(fake.in_flight.values()) == 7 - left)  # type: ignore[misc]
                assert app.hold.held("chat-a") == left
            fake.gate.set()  # answers end: the one left goes where room frees
            served = [r.json()["served_by"] for r in await asyncio.gather(*pending)]
            counts = sorted(served.count(f"127.0.0.1:{p}") for p in (9001, 9002, 9003))
            assert counts == [2, 2, 3] and max(fake.peak.values()) == 2 and app.hold.total() == 0

    run(go)


def test_a_new_request_waits_behind_held_ones_and_goes_when_room_frees() -> None:
    async def go() -> None:
        async with gateway(GatewayConfig(scrape_interval_s=3600, replica_concurrency=1)) as (
            app,
            registry,
            fake,
            client,
        ):
            registry.add_replica("chat-a", "http://127.0.0.1:9001")
            fake.gate = asyncio.Event()
            first = asyncio.ensure_future(client.post("/v1/chat/completions", json=CHAT, headers=A))
            await _wait_until(lambda: fake.in_flight.get("127.0.0.1:9001") == 1)
            later = []
            for slo in ("batch", "interactive"):
                body = {**CHAT, "messages": [{"role": "user", "content": slo}]}
                headers = {**A, "x-tessera-slo": slo}
                later.append(asyncio.ensure_future(client.post("/v1/chat/completions", json=body, headers=headers)))
                await _wait_until(lambda: app.hold.held("chat-a") == len(later))
            fake.gate.set()
            assert all(r.status_code == 200 for r in await asyncio.gather(first, *later))
            order = [json.loads(body)["messages"][0]["content"] for _, body in fake.bodies]
            assert order == ["hi", "interactive", "batch"] and fake.peak["127.0.0.1:9001"] == 1

    run(go)


def test_get_a_model_answers_like_openai_and_404_in_its_error_shape() -> None:
    async def go() -> None:
        async with gateway() as (_, _, _, client):
            mine = await client.get("/v1/models/chat-a", headers=A)
            assert mine.status_code == 200
            assert mine.json() == {"id": "chat-a", "object": "model", "created": 0, "owned_by": "team-a"}
            for name in ("chat-b", "nope"):  # another tenant's model reads as an unknown one
                missing = await client.get(f"/v1/models/{name}", headers=A)
                assert missing.status_code == 404
                error = missing.json()["error"]
                assert (error["type"], error["code"], error["param"]) == (
                    "invalid_request_error",
                    "model_not_found",
                    "model",
                )
                assert name in error["message"]
            assert (await client.get("/v1/models/chat-a")).status_code == 401
            assert (await client.post("/v1/models/chat-a", headers=A)).status_code == 405

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
