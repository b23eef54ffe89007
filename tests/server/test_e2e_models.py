"""Models deployed on a real ``tessera up`` and used through its gateway with the official ``openai`` client: the
replicas are workloads on a GPU share, a tenant's token is its API key and sees only its models, a model at zero
replicas holds a burst of 50 concurrent requests while it starts (0 errors), then goes back to zero after its idle
timeout and frees its share, and a replica that ends is restarted (it is a service)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from live_server import ADMIN, LiveServer, wait_for

pytestmark = pytest.mark.e2e


@pytest.fixture
def server(tmp_path: Path) -> Any:
    live = LiveServer(tmp_path / "server", gpus="2xA100-80GB")
    live.start()
    yield live
    try:
        with live.client() as client:
            for m in client.models():
                client.delete_model(m["name"])
            wait_for(lambda: not client.models(), timeout_s=30)
        live.cancel_all()
    finally:
        live.stop()


def gateway(server: LiveServer, token: str = ADMIN, **kwargs: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/openai/v1", api_key=token, max_retries=0, **kwargs)


def model(server: LiveServer, name: str) -> dict[str, Any]:
    with server.client() as client:
        return client.model(name)


def test_chat_streaming_and_the_model_list_through_the_gateway(server: LiveServer) -> None:
    with server.client() as client:
        out = client.deploy_model({"name": "chat", "engine": "sim", "model": "llama3-8b", "gpu_fraction": 0.25})
        assert out["openai_base_url"] == f"{server.url}/openai/v1"
        team = client.create_token("team-a")["token"]
    wait_for(lambda: model(server, "chat")["state"] == "ready", timeout_s=30)
    ai = gateway(server)
    answer = ai.chat.completions.create(model="chat", messages=[{"role": "user", "content": "hi"}], max_tokens=8)
    assert answer.choices[0].message.content and answer.usage is not None and answer.usage.completion_tokens == 8
    chunks = ai.chat.completions.create(
        model="chat", messages=[{"role": "user", "content": "hi"}], max_tokens=5, stream=True
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len(text.split()) == 5
    assert [m.id for m in ai.models.list()] == ["chat"]
    # Another tenant's key sees no model and gets OpenAI's 404 for this one.
    assert [m.id for m in gateway(server, team).models.list()] == []
    with pytest.raises(openai.NotFoundError):
        gateway(server, team).chat.completions.create(model="chat", messages=[{"role": "user", "content": "x"}])
    with pytest.raises(openai.AuthenticationError):
        gateway(server, "not-a-token").models.list()
    # Per model and SLO class, for admins; the public scrape names no model.
    admin = httpx.get(f"{server.url}/metrics", headers={"Authorization": f"Bearer {ADMIN}"}).text
    assert 'tessera_gateway_time_to_first_token_seconds_count{served_model="chat",slo="standard"} 2.0' in admin
    assert 'tessera_gateway_time_per_output_token_seconds_count{served_model="chat",slo="standard"} 1.0' in admin
    assert 'tessera_gateway_requests_total{code="200",served_model="chat",slo="standard"} 2.0' in admin
    assert 'tessera_model_replicas{kind="running",served_model="chat"} 1.0' in admin
    assert 'tessera_model_replica_starts_total{served_model="chat"} 1.0' in admin
    assert "tessera_gateway_route_decision_seconds_count 2.0" in admin
    assert "served_model" not in httpx.get(f"{server.url}/metrics").text


def test_a_burst_at_zero_replicas_is_held_while_the_model_starts_and_it_returns_to_zero(server: LiveServer) -> None:
    body = {"name": "burst", "engine": "sim", "model": "llama3-8b", "gpu_fraction": 0.5}
    body |= {"min_replicas": 0, "max_replicas": 2, "idle_timeout": "3s"}
    with server.client() as client:
        client.deploy_model(body)
    assert model(server, "burst")["state"] == "scaled-to-zero"

    async def burst() -> list[float | BaseException]:
        ai = openai.AsyncOpenAI(base_url=f"{server.url}/openai/v1", api_key=ADMIN, max_retries=0, timeout=120)

        async def one(i: int) -> float:
            start = time.monotonic()
            stream = await ai.chat.completions.create(
                model="burst", messages=[{"role": "user", "content": f"hello {i}"}], max_tokens=8, stream=True
            )
            first: float | None = None
            async for _ in stream:
                first = time.monotonic() - start if first is None else first
            assert first is not None
            return first

        return await asyncio.gather(*(one(i) for i in range(50)), return_exceptions=True)

    results = asyncio.run(burst())
    errors = [r for r in results if isinstance(r, BaseException)]
    assert errors == [], errors[:3]
    ttft = sorted(r for r in results if isinstance(r, float))
    print(f"\nscale from zero: 50 requests, 0 errors, TTFT min {ttft[0]:.2f} s, max {ttft[-1]:.2f} s (start included)")
    assert model(server, "burst")["replicas"] >= 1
    wait_for(lambda: model(server, "burst")["state"] == "scaled-to-zero", timeout_s=30)
    with server.client() as client:
        held = [g for n in client.nodes() for g in n["gpus"] if g["allocated_milli"]]
    assert held == []  # its GPU share is free again


def test_a_replica_that_dies_is_restarted_and_the_gateway_keeps_serving(server: LiveServer) -> None:
    with server.client() as client:
        client.deploy_model({"name": "phoenix", "engine": "sim", "gpu_fraction": 0.25})
        first = wait_for(lambda: model(server, "phoenix")["replica_workloads"], timeout_s=30)[0]
        wait_for(lambda: model(server, "phoenix")["state"] == "ready", timeout_s=30)
        client.cancel(first)  # the replica goes away; the controller asks for another
    wait_for(lambda: first not in model(server, "phoenix")["replica_workloads"], timeout_s=30)
    wait_for(lambda: model(server, "phoenix")["replicas"] == 1, timeout_s=30)
    ai = gateway(server, timeout=60)
    answer = ai.completions.create(model="phoenix", prompt="once upon", max_tokens=4)
    assert answer.choices[0].text


def test_kill_9_of_the_server_while_replicas_stream_readopts_them_and_serves_again(server: LiveServer) -> None:
    with server.client() as client:
        client.deploy_model({"name": "durable", "engine": "sim", "gpu_fraction": 0.25, "min_replicas": 2})
    wait_for(lambda: model(server, "durable")["replicas"] == 2, timeout_s=30)
    before = sorted(model(server, "durable")["replica_workloads"])
    ai = gateway(server, timeout=30)
    stream = ai.chat.completions.create(
        model="durable", messages=[{"role": "user", "content": "tell me"}], max_tokens=2000, stream=True
    )
    first = next(iter(stream))
    assert first.choices is not None
    server.kill_hard()
    with pytest.raises(openai.APIError):  # the stream ends with a clean error, not a hang or a truncated success
        for _ in stream:
            pass
    server.start()
    wait_for(lambda: model(server, "durable")["replicas"] == 2, timeout_s=30)
    assert sorted(model(server, "durable")["replica_workloads"]) == before  # re-adopted, none launched again
    with server.client() as client:
        assert all(client.workload(i)["attempts"] == 1 for i in before)
    answer = wait_for(
        lambda: _try(lambda: gateway(server).completions.create(model="durable", prompt="again", max_tokens=3)),
        timeout_s=30,
    )
    assert answer.choices[0].text


def _try(call: Any) -> Any:
    try:
        return call()
    except openai.APIError:
        return None
