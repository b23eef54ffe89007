"""The SLO class reaches engines with priority scheduling as the body's ``priority``: spliced into the client's bytes
(whatever their whitespace or characters), a client's own priority standing only where it is no more urgent than
its class, and only for engines that schedule by it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import pytest

from tessera.serving.engines.openai_wire import ChatRequest, CompletionRequest, EmbeddingRequest, parse_request
from tessera.serving.gateway.app import Gateway, GatewayConfig
from tessera.serving.gateway.auth import StaticKeys
from tessera.serving.gateway.bridge import route_of
from tessera.serving.gateway.priority import PriorityError, forwarded_body, splice_priority
from tessera.serving.gateway.registry import InMemoryRegistry, ModelRoute
from tessera.serving.gateway.upstream_httpx import HttpxUpstream
from tessera.serving.policies.requests import SloClass
from tessera.serving.replicas import DeployedModel
from tessera.serving.setups import serving_setup, with_setup_knobs

A = {"authorization": "Bearer key-a"}
CHAT = {"model": "chat-a", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
BY_CLASS = ModelRoute("chat-a", "team-a", SloClass.STANDARD, engine_priority=True, class_priority=True)


@asynccontextmanager
async def gateway() -> AsyncIterator[tuple[Gateway, InMemoryRegistry, list[bytes], httpx.AsyncClient]]:
    """The gateway in-process, its replicas a mock transport that keeps each body it is sent."""
    bodies: list[bytes] = []

    def replica(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/metrics":
            return httpx.Response(200, text="")
        bodies.append(request.content)
        answer = httpx.ByteStream(b'{"object": "chat.completion"}')  # read as it comes, as from a socket
        return httpx.Response(200, headers={"content-type": "application/json"}, stream=answer)

    registry = InMemoryRegistry()
    upstream = HttpxUpstream(httpx.AsyncClient(transport=httpx.MockTransport(replica)))
    app = Gateway(registry, StaticKeys({"key-a": "team-a"}), GatewayConfig(scrape_interval_s=3600), upstream)
    await app.start()
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw")
    try:
        yield app, registry, bodies, client
    finally:
        await client.aclose()
        await app.close()


def _forward(body: bytes, slo: SloClass, kind: type[ChatRequest | CompletionRequest] = ChatRequest) -> bytes:
    parsed = parse_request(kind, body)
    assert not isinstance(parsed, tuple)
    return forwarded_body(body, parsed, slo)


def test_each_class_maps_to_an_engine_priority_lower_for_the_more_urgent_and_back() -> None:
    assert [c.engine_priority for c in SloClass] == [0, 1, 2]  # vLLM serves lower values first
    assert [SloClass.of_engine_priority(c.engine_priority) for c in SloClass] == list(SloClass)
    assert SloClass.of_engine_priority(-7) is SloClass.INTERACTIVE and SloClass.of_engine_priority(9) is SloClass.BATCH


@pytest.mark.parametrize(
    "body",
    [
        b'{"model":"m","prompt":"hi"}',
        b'  \r\n{ "model" : "m" ,\t"prompt" : "hi"\n}\n\t \r\n',  # whitespace around and inside
        '{"model":"m","prompt":"h\u00e9 \u6f22\u5b57 \U0001f600 } {"}'.encode(),  # UTF-8 and braces in a string
        b'{"model":"m","prompt":"\\u00e9\\"}","stop":["}"],"logit_bias":{"1":2}}',  # escapes, nested object last
    ],
)
def test_the_class_priority_is_spliced_into_the_clients_bytes_which_stay_as_they_were(body: bytes) -> None:
    out = _forward(body, SloClass.BATCH, CompletionRequest)
    assert json.loads(out) == {**json.loads(body), "priority": 2}
    end = body.rfind(b"}")
    assert out.startswith(body[:end]) and out.endswith(body[end:])  # only the member added, nothing re-encoded


def test_an_empty_object_gets_no_stray_comma() -> None:
    assert json.loads(splice_priority(b"{ \n}", 1)) == {"priority": 1}


def test_a_client_may_lower_its_own_urgency_but_never_raise_it_above_its_class() -> None:
    lower = json.dumps({**CHAT, "priority": 5}).encode()
    assert _forward(lower, SloClass.STANDARD) == lower  # less urgent than its class: its own value, bytes untouched
    same = json.dumps({**CHAT, "priority": 1}).encode()
    assert _forward(same, SloClass.STANDARD) == same
    for raised in (-100, 0):
        body = json.dumps({**CHAT, "messages": [{"role": "user", "content": "é"}], "priority": raised}).encode()
        out = json.loads(_forward(body, SloClass.STANDARD))
        assert out["priority"] == 1 and out["messages"][0]["content"] == "é"
    null = json.dumps({**CHAT, "priority": None}).encode()
    assert json.loads(_forward(null, SloClass.BATCH))["priority"] == 2
    duplicated = b'{"model":"m","messages":[{"role":"user","content":"x"}],"priority":7,"priority":-1}'
    once = _forward(duplicated, SloClass.INTERACTIVE)  # parsed as the last one (-1): raised, so rewritten once
    assert once.count(b'"priority"') == 1 and json.loads(once)["priority"] == 0
    escaped = b'{"model":"m","messages":[{"role":"user","content":"x"}],"\\u0070riority":-3}'
    assert json.loads(_forward(escaped, SloClass.BATCH))["priority"] == 2  # the key spelt with an escape is seen


def test_without_class_priority_no_field_is_added_and_a_client_may_still_not_go_below_the_engines_default() -> None:
    def forward(body: bytes) -> bytes:
        parsed = parse_request(ChatRequest, body)
        assert not isinstance(parsed, tuple)
        return forwarded_body(body, parsed, None)

    plain = json.dumps(CHAT).encode()
    assert forward(plain) == plain  # the engine serves it at its default, 0, as every other request
    lower = json.dumps({**CHAT, "priority": 3}).encode()
    assert forward(lower) == lower
    assert json.loads(forward(json.dumps({**CHAT, "priority": -9}).encode()))["priority"] == 0


@pytest.mark.parametrize("bad", ["high", 1.5, True, [0], {"a": 1}])
def test_a_priority_that_is_no_integer_is_refused(bad: object) -> None:
    with pytest.raises(PriorityError, match="priority: must be an integer"):
        _forward(json.dumps({**CHAT, "priority": bad}).encode(), SloClass.STANDARD)


def test_embeddings_get_it_too() -> None:
    body = b'{"model":"m","input":"abc"}'
    parsed = parse_request(EmbeddingRequest, body)
    assert not isinstance(parsed, tuple)
    assert json.loads(forwarded_body(body, parsed, SloClass.INTERACTIVE))["priority"] == 0


def test_only_the_routes_of_engines_with_priority_scheduling_under_a_setup_with_engine_priority_carry_it() -> None:
    """As in the twin: the ``tessera`` setup orders engines' queues by class, ``static`` leaves them in arrival
    order (no field sent: every request is 0 to the engine)."""

    def model(engine: str) -> DeployedModel:
        return DeployedModel(1, "m", "t", "t", engine, "", 0, 0, 0, 1, 1, 30.0, "standard")

    engines = ("vllm", "sim", "sglang", "transformers")
    tessera = serving_setup("tessera")
    routes = {e: route_of(model(e), tessera) for e in engines}
    expected = {"vllm": True, "sim": True, "sglang": False, "transformers": False}
    assert {e: r.class_priority for e, r in routes.items()} == expected
    for setup in (tessera, serving_setup("static"), with_setup_knobs(tessera, ["engine_priority=false"])):
        assert {e: route_of(model(e), setup).engine_priority for e in engines} == expected  # the guard stays
        if setup is not tessera:
            assert not any(route_of(model(e), setup).class_priority for e in engines)


def test_the_gateway_forwards_each_requests_class_as_its_priority_and_refuses_a_bad_one() -> None:
    async def go() -> None:
        async with gateway() as (_, registry, bodies, client):
            registry.deploy(BY_CLASS)
            registry.deploy(ModelRoute("chat-b", "team-a"))  # an engine without priority scheduling
            registry.add_replica("chat-a", "http://127.0.0.1:9001")
            registry.add_replica("chat-b", "http://127.0.0.1:9002")
            for slo in ("", "interactive", "batch"):
                headers = {**A, "x-tessera-slo": slo} if slo else A
                assert (await client.post("/v1/chat/completions", json=CHAT, headers=headers)).status_code == 200
            raised = await client.post("/v1/chat/completions", json={**CHAT, "priority": -5}, headers=A)
            bad = await client.post("/v1/chat/completions", json={**CHAT, "priority": "high"}, headers=A)
            plain = await client.post("/v1/chat/completions", json={**CHAT, "model": "chat-b"}, headers=A)
            assert raised.status_code == plain.status_code == 200
            assert bad.status_code == 400 and bad.json()["error"]["param"] == "priority"
            sent = [json.loads(body) for body in bodies]
            assert [b.get("priority") for b in sent] == [1, 0, 2, 1, None]  # the model's class, the header's; clamped
            assert sent[-1] == {**CHAT, "model": "chat-b"}  # no field for an engine that does not schedule by it

    asyncio.run(go())


def test_held_requests_keep_their_priority_when_released() -> None:
    async def go() -> None:
        async with gateway() as (app, registry, bodies, client):
            registry.deploy(BY_CLASS)
            pending = asyncio.ensure_future(
                client.post("/v1/chat/completions", json=CHAT, headers={**A, "x-tessera-slo": "batch"})
            )
            while app.hold.held("chat-a") < 1:
                await asyncio.sleep(0.005)
            registry.add_replica("chat-a", "http://127.0.0.1:9001")
            assert (await pending).status_code == 200
            assert json.loads(bodies[0])["priority"] == 2

    asyncio.run(go())
