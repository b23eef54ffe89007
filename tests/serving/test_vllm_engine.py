"""The vLLM adapter against answers recorded from a real vLLM (``vllm_recorded/``, replayed by ``engine_fake``): the
command a replica runs, health, the router's stats read from vLLM's own metric names, and the sleep mode through
``/sleep`` and ``/wake_up``, which vLLM serves only in its dev mode (otherwise reported unsupported)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from engine_fake import Canned, FakeEngine, serving_on_own_loop

from tessera.serving.engines.base import EngineError, EngineUnsupported
from tessera.serving.engines.vllm import VllmEngine

RECORDED = Path(__file__).parent / "vllm_recorded"
METRICS = (RECORDED / "metrics.prom").read_bytes()
ASLEEP = (RECORDED / "metrics_asleep.prom").read_bytes()


def test_a_replica_runs_vllm_capped_at_its_share_and_in_dev_mode_only_for_the_sleep_mode() -> None:
    gpu = {"CUDA_VISIBLE_DEVICES": "GPU-1234"}
    command = VllmEngine("chat", 8001, weights="/m", mem_fraction=0.25, python="/venv/bin/python", env=gpu).command()
    argv = list(command.argv)
    assert argv[:3] == ["/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    assert argv[argv.index("--model") + 1] == "/m" and argv[argv.index("--served-model-name") + 1] == "chat"
    assert argv[argv.index("--gpu-memory-utilization") + 1] == "0.25"
    assert "--enable-sleep-mode" not in argv and "VLLM_SERVER_DEV_MODE" not in command.env
    assert command.env["HF_HUB_OFFLINE"] == "1" and "PYTHONPATH" not in command.env
    sleepy = VllmEngine("chat", 8001, weights="/m", sleep_mode=True, env=gpu)
    assert sleepy.sleep_capable and not VllmEngine("chat", 8001).sleep_capable
    assert "--enable-sleep-mode" in sleepy.command().argv and sleepy.command().env["VLLM_SERVER_DEV_MODE"] == "1"
    cpu = VllmEngine("chat", 8001, weights="/m", env={"CUDA_VISIBLE_DEVICES": ""}).command()
    assert "--enforce-eager" in cpu.argv and cpu.env["VLLM_CPU_KVCACHE_SPACE"] == "1"  # engine_exec's CPU flags


@pytest.fixture
def fake() -> Iterator[tuple[asyncio.AbstractEventLoop, FakeEngine]]:
    server = FakeEngine(
        {
            ("GET", "/health"): Canned(200, b""),
            ("GET", "/metrics"): Canned(200, METRICS, "text/plain; version=0.0.4"),
            ("POST", "/sleep?level=1"): Canned(200, b'{"status":"sleeping","level":1}'),
            ("POST", "/wake_up"): Canned(200, b'{"status":"awake","tags":null}'),
        }
    )
    yield from serving_on_own_loop(server)


def test_health_and_stats_read_vllms_own_metrics(fake: tuple[asyncio.AbstractEventLoop, FakeEngine]) -> None:
    loop, server = fake
    engine = VllmEngine("smollm2", server.port)
    assert loop.run_until_complete(engine.health())
    stats = loop.run_until_complete(engine.stats())
    assert (stats.running, stats.waiting) == (6, 0)  # vllm:num_requests_running, vllm:num_requests_waiting
    assert stats.kv_cache_usage == pytest.approx(0.03314917127071826)  # vllm:kv_cache_usage_perc
    assert (stats.prompt_tokens_total, stats.generation_tokens_total, stats.sleeping) == (222, 241, False)
    server.answers[("GET", "/metrics")] = Canned(200, ASLEEP)  # vllm:engine_sleep_state{sleep_state="awake"} 0
    assert loop.run_until_complete(engine.stats()).sleeping
    loop.run_until_complete(engine.stop())


def test_sleep_and_wake_post_to_vllms_dev_endpoints(fake: tuple[asyncio.AbstractEventLoop, FakeEngine]) -> None:
    loop, server = fake
    engine = VllmEngine("smollm2", server.port, sleep_mode=True)
    loop.run_until_complete(engine.sleep())
    loop.run_until_complete(engine.wake())
    loop.run_until_complete(engine.stop())
    assert [(m, p) for m, p, _ in server.calls] == [("POST", "/sleep?level=1"), ("POST", "/wake_up")]


def test_without_the_sleep_mode_sleep_is_unsupported_and_asks_nothing(
    fake: tuple[asyncio.AbstractEventLoop, FakeEngine],
) -> None:
    loop, server = fake
    engine = VllmEngine("smollm2", server.port)
    with pytest.raises(EngineUnsupported):
        loop.run_until_complete(engine.sleep())
    with pytest.raises(EngineUnsupported):
        loop.run_until_complete(engine.wake())
    loop.run_until_complete(engine.stop())
    assert server.calls == []


def test_a_server_without_its_dev_mode_is_told_apart(fake: tuple[asyncio.AbstractEventLoop, FakeEngine]) -> None:
    loop, server = fake
    del server.answers[("POST", "/sleep?level=1")]  # dev mode off: FastAPI's 404
    engine = VllmEngine("smollm2", server.port, sleep_mode=True)
    with pytest.raises(EngineError, match="VLLM_SERVER_DEV_MODE=1 and --enable-sleep-mode"):
        loop.run_until_complete(engine.sleep())
    loop.run_until_complete(engine.stop())
