"""End to end: real sim engine processes on 127.0.0.1, the gateway under uvicorn, and the official ``openai`` client
unchanged (chat, streaming, completions, embeddings, model list, errors), holding from zero, 429 on overflow, and a
client disconnect cancelling the engine's request."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import httpx
import openai
import pytest

from tessera.serving.engines.process import free_port
from tessera.serving.engines.sim import SimEngine
from tessera.serving.gateway.app import Gateway, GatewayConfig
from tessera.serving.gateway.auth import StaticKeys
from tessera.serving.gateway.registry import InMemoryRegistry, ModelRoute
from tessera.serving.gateway.serve import uvicorn_server

pytestmark = pytest.mark.e2e

T = TypeVar("T")
KEYS = {"key-a": "team-a", "key-b": "team-b"}
START_TIMEOUT_S = 30.0


class LiveGateway:
    """The gateway under uvicorn on a loop in a background thread; engines are started on that loop too."""

    def __init__(self, config: GatewayConfig) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.registry = InMemoryRegistry()
        self.gateway = Gateway(self.registry, StaticKeys(KEYS), config)
        self.port = free_port()
        self.server = uvicorn_server(self.gateway, port=self.port)
        self.serving = asyncio.run_coroutine_threadsafe(self.server.serve(), self.loop)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self.server.started:
            assert time.monotonic() < deadline and not self.serving.done(), "the gateway did not start"
            time.sleep(0.01)
        self.engines: list[SimEngine] = []

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def call(self, coroutine: Coroutine[Any, Any, T], timeout_s: float = START_TIMEOUT_S) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout_s)

    def on_loop(self, action: Any, *args: Any) -> Any:
        async def run() -> Any:
            return action(*args)

        return self.call(run())

    def start_engine(self, model: str, speedup: float = 20.0) -> SimEngine:
        engine = SimEngine(model, free_port(), speedup=speedup)
        self.call(engine.start(START_TIMEOUT_S))
        self.engines.append(engine)
        return engine

    def deploy(self, model: str, tenant: str = "team-a") -> None:
        self.on_loop(self.registry.deploy, ModelRoute(model, tenant))

    def add_replica(self, model: str, engine: SimEngine) -> int:
        rid: int = self.on_loop(self.registry.add_replica, model, engine.base_url)
        return rid

    def close(self) -> None:
        self.server.should_exit = True
        self.serving.result(10)
        for engine in self.engines:
            self.call(engine.stop(2.0))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


def client(gw: LiveGateway, key: str = "key-a") -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.base_url, api_key=key, max_retries=0, timeout=30.0)


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
