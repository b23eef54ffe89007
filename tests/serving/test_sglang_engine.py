"""The SGLang adapter and the gateway in front of SGLang, against SGLang-format answers replayed by
``sglang_replay`` (SGLang has no CPU build here): the command a replica runs, health, the router's stats read from
SGLang's metric names, the sleep mode's endpoints, and the official ``openai`` client through the gateway."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator

import httpx
import openai
import pytest
from engine_fake import serving_on_own_loop
from gateway_harness import LiveGateway, client
from sglang_replay import MODEL, SGLangReplay

from tessera.serving.engines.base import EngineError
from tessera.serving.engines.sglang import SGLangEngine
from tessera.serving.gateway.app import GatewayConfig


def test_a_replica_runs_sglang_with_metrics_on_and_its_memory_capped_at_the_share() -> None:
    command = SGLangEngine(
        "chat", 30000, weights="/models/smollm2", mem_fraction=0.25, python="/venv/bin/python"
    ).command()
    argv = list(command.argv)
    assert argv[:3] == ["/venv/bin/python", "-m", "sglang.launch_server"]
    assert argv[argv.index("--model-path") + 1] == "/models/smollm2"
    assert argv[argv.index("--served-model-name") + 1] == "chat"
    assert argv[argv.index("--mem-fraction-static") + 1] == "0.25"
    assert "--enable-metrics" in argv  # the router reads sglang:num_running_reqs and friends
    assert argv[argv.index("--host") + 1] == "127.0.0.1" and argv[argv.index("--port") + 1] == "30000"
    assert command.env["HF_HUB_OFFLINE"] == "1" and "PYTHONPATH" not in command.env
    whole = list(SGLangEngine("chat", 30000, weights="/m").command().argv)
    assert "--mem-fraction-static" not in whole  # a whole GPU: SGLang's own default


@pytest.fixture
def replay() -> Iterator[tuple[asyncio.AbstractEventLoop, SGLangReplay]]:
    server = SGLangReplay()
    yield from serving_on_own_loop(server)


def test_health_stats_and_the_sleep_mode_speak_sglangs_endpoints(
    replay: tuple[asyncio.AbstractEventLoop, SGLangReplay],
) -> None:
    loop, server = replay
    engine = SGLangEngine(MODEL, server.port)
    assert loop.run_until_complete(engine.health())
    stats = loop.run_until_complete(engine.stats())
    assert (stats.running, stats.waiting, stats.kv_cache_usage) == (3, 2, 0.42)
    assert (stats.prompt_tokens_total, stats.generation_tokens_total) == (5120, 1344)
    loop.run_until_complete(engine.sleep())
    assert server.released
    loop.run_until_complete(engine.wake())
    assert not server.released
    loop.run_until_complete(engine.stop())
    posts = [(path, json.loads(body)) for method, path, body in server.calls if method == "POST"]
    assert posts == [("/release_memory_occupation", {}), ("/resume_memory_occupation", {})]


def test_a_refused_sleep_says_what_sglang_needs() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        return httpx.Response(400, json={"error": "memory saver is not enabled"})

    engine = SGLangEngine(MODEL, 30000, client=httpx.AsyncClient(transport=httpx.MockTransport(refuse)))
    with pytest.raises(EngineError, match="--enable-memory-saver"):
        asyncio.run(sleep_then_close(engine))


async def sleep_then_close(engine: SGLangEngine) -> None:
    try:
        await engine.sleep()
    finally:
        await engine.stop()


@pytest.mark.e2e
def test_the_openai_client_chats_and_streams_through_the_gateway_to_sglang() -> None:
    gw = LiveGateway(GatewayConfig(scrape_interval_s=0.2))
    server = SGLangReplay()
    gw.call(server.start())
    try:
        gw.deploy(MODEL)
        gw.add_replica(MODEL, server)
        openai_client = client(gw)
        messages: list[openai.types.chat.ChatCompletionMessageParam] = [
            {"role": "user", "content": "What is the capital of France?"}
        ]
        answer = openai_client.chat.completions.create(model=MODEL, messages=messages, max_tokens=16)
        assert answer.choices[0].message.content == "The capital of France is Paris."
        assert answer.usage is not None and answer.usage.completion_tokens == 8
        stream = openai_client.chat.completions.create(model=MODEL, messages=messages, max_tokens=16, stream=True)
        pieces, finish = [], None
        for chunk in stream:
            if chunk.choices:
                pieces.append(chunk.choices[0].delta.content or "")
                finish = chunk.choices[0].finish_reason or finish
        assert "".join(pieces) == "The capital of France is Paris." and finish == "stop"
        forwarded = [json.loads(body) for method, path, body in server.calls if path == "/v1/chat/completions"]
        assert [request.get("stream", False) for request in forwarded] == [
            False,
            True,
        ]  # the body reached SGLang as sent
        deadline = time.monotonic() + 10
        while not any(path == "/metrics" for _, path, _ in server.calls):  # the router scrapes SGLang's gauges
            assert time.monotonic() < deadline, "the gateway never read the replica's /metrics"
            time.sleep(0.05)
    finally:
        gw.call(server.stop())
        gw.close()
