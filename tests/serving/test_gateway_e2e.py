"""End to end: real sim engine processes on 127.0.0.1, the gateway under uvicorn, and the official ``openai`` client
unchanged (chat, streaming, completions, embeddings, model list, errors), holding from zero, 429 on overflow, and a
client disconnect cancelling the engine's request."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import openai
import pytest
from gateway_harness import START_TIMEOUT_S, LiveGateway, client

from tessera.serving.gateway.app import GatewayConfig

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def live() -> Iterator[LiveGateway]:
    gw = LiveGateway(GatewayConfig(scrape_interval_s=0.2))
    try:
        gw.deploy("chat")
        gw.add_replica("chat", gw.start_engine("chat"))
        gw.deploy("theirs", tenant="team-b")
        yield gw
    finally:
        gw.close()


def test_the_openai_client_lists_chats_streams_completes_and_embeds(live: LiveGateway) -> None:
    api = client(live)
    assert [m.id for m in api.models.list()] == ["chat"]
    messages: Any = [{"role": "user", "content": "What is the capital of France?"}]
    whole = api.chat.completions.create(model="chat", messages=messages, max_tokens=8)
    text = whole.choices[0].message.content
    assert text and whole.usage is not None and whole.usage.completion_tokens == 8
    pieces = [
        chunk.choices[0].delta.content or ""
        for chunk in api.chat.completions.create(model="chat", messages=messages, max_tokens=8, stream=True)
        if chunk.choices
    ]
    assert len([p for p in pieces if p]) == 8 and "".join(pieces) == text  # token by token, the same text
    completion = api.completions.create(model="chat", prompt="Once upon", max_tokens=4)
    assert len(completion.choices[0].text.split()) == 4
    embedding = api.embeddings.create(model="chat", input="hello")
    assert len(embedding.data[0].embedding) == 16


def test_unknown_foreign_and_malformed_requests_get_openai_errors(live: LiveGateway) -> None:
    api = client(live)
    messages: Any = [{"role": "user", "content": "hi"}]
    with pytest.raises(openai.NotFoundError) as unknown:
        api.chat.completions.create(model="nope", messages=messages)
    assert unknown.value.code == "model_not_found"
    with pytest.raises(openai.NotFoundError):
        api.chat.completions.create(model="theirs", messages=messages)  # team-b's model
    with pytest.raises(openai.BadRequestError) as empty:
        api.chat.completions.create(model="chat", messages=[])
    assert empty.value.param == "messages"
    with pytest.raises(openai.BadRequestError) as too_long:
        api.chat.completions.create(model="chat", messages=messages, max_tokens=100_000)
    assert "maximum context length" in str(too_long.value)  # the engine's answer, passed through
    with pytest.raises(openai.AuthenticationError):
        client(live, key="wrong").models.list()
    assert [m.id for m in client(live, key="key-b").models.list()] == ["theirs"]


def test_a_request_for_a_model_still_starting_is_held_and_then_served(live: LiveGateway) -> None:
    live.deploy("cold")
    messages: Any = [{"role": "user", "content": "wake up"}]
    with ThreadPoolExecutor(2) as pool:
        started = time.monotonic()
        pending = pool.submit(client(live).chat.completions.create, model="cold", messages=messages, max_tokens=3)
        time.sleep(0.5)
        assert not pending.done()
        live.add_replica("cold", live.start_engine("cold"))  # the replica becomes ready after the request came
        answer = pending.result(START_TIMEOUT_S)
    assert answer.choices[0].message.content and time.monotonic() - started >= 0.5


def test_one_request_more_than_the_hold_queue_takes_is_429_with_retry_after() -> None:
    gw = LiveGateway(GatewayConfig(max_held_per_model=2, retry_after_s=7))
    try:
        gw.deploy("cold")
        messages: Any = [{"role": "user", "content": "hi"}]
        with ThreadPoolExecutor(2) as pool:
            held = [pool.submit(client(gw).chat.completions.create, model="cold", messages=messages) for _ in range(2)]
            deadline = time.monotonic() + 10
            while gw.on_loop(gw.gateway.hold.held, "cold") < 2:
                assert time.monotonic() < deadline
                time.sleep(0.01)
            with pytest.raises(openai.RateLimitError) as over:
                client(gw).chat.completions.create(model="cold", messages=messages)
            assert over.value.response.headers["retry-after"] == "7"
            gw.add_replica("cold", gw.start_engine("cold"))
            assert all(f.result(START_TIMEOUT_S).choices[0].message.content for f in held)
    finally:
        gw.close()


def test_a_client_that_disconnects_cancels_its_request_in_the_engine() -> None:
    gw = LiveGateway(GatewayConfig())
    try:
        gw.deploy("slow")
        engine = gw.start_engine("slow", speedup=1.0)
        gw.add_replica("slow", engine)
        body = {"model": "slow", "messages": [{"role": "user", "content": "go on"}], "max_tokens": 4000, "stream": True}
        with (
            httpx.Client(timeout=30.0) as http,
            http.stream(
                "POST", f"{gw.base_url}/chat/completions", json=body, headers={"authorization": "Bearer key-a"}
            ) as response,
        ):
            assert response.status_code == 200
            lines = response.iter_lines()  # held: a dropped iterator is closed, and closing it drops the connection
            next(lines)  # streaming has begun
            assert gw.call(engine.stats()).running == 1
        deadline = time.monotonic() + 10  # the client is gone: the engine must drop the request
        while gw.call(engine.stats()).running:
            assert time.monotonic() < deadline, "the engine still runs the request of a client that left"
            time.sleep(0.05)
        stats = gw.call(engine.stats())
        assert stats.generation_tokens_total < 4000
    finally:
        gw.close()
