"""``HttpEngine``: what every OpenAI-compatible engine adapter shares (health, stats, start and stop over HTTP).

An adapter subclasses it and says how to launch its engine (``command``) and whether it has a sleep mode; vLLM's
sleep endpoints (``POST /sleep``, ``POST /wake_up``) are the default, which the sim serves too. The adapters of
real engines launched from local weights (vLLM, SGLang, transformers serve) take their common launch options once,
through ``LaunchedEngine``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import TypedDict, Unpack

import httpx

from tessera.serving.engines.base import EngineCommand, EngineError, EngineStats, EngineUnsupported, ProcessRunner
from tessera.serving.engines.metrics import parse_metrics
from tessera.serving.engines.process import LocalProcess

HEALTH_POLL_S = 0.05


class HttpEngine:
    """The common part of the engine adapters (an ``EngineAdapter`` once a subclass gives ``command``)."""

    kind = "http"
    sleep_capable = False

    def __init__(
        self,
        model: str,
        port: int,
        host: str = "127.0.0.1",
        runner: ProcessRunner | None = None,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        self.model = model
        self.host = host
        self.port = port
        self.runner: ProcessRunner = runner if runner is not None else LocalProcess()
        self._client = client if client is not None else httpx.AsyncClient(timeout=5.0, trust_env=False)

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def command(self) -> EngineCommand:
        raise NotImplementedError

    async def start(self, timeout_s: float) -> None:
        await self.runner.launch(self.command())
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while loop.time() < deadline:
            code = self.runner.exit_code()
            if code is not None:
                raise EngineError(f"{self.kind} engine for {self.model!r} exited with status {code} while starting")
            if await self.health():
                return
            await asyncio.sleep(HEALTH_POLL_S)
        await self.runner.terminate(1.0)
        raise EngineError(f"{self.kind} engine for {self.model!r} not healthy after {timeout_s:g} s")

    async def stop(self, grace_s: float = 5.0) -> None:
        await self.runner.terminate(grace_s)
        await self._client.aclose()

    async def health(self) -> bool:
        try:
            response = await self._client.get(f"{self.base_url}/health")
        except httpx.HTTPError:
            return False
        return response.status_code == 200

    async def stats(self) -> EngineStats:
        return parse_metrics(await self._metrics_text())

    async def _metrics_text(self) -> str:
        try:
            response = await self._client.get(f"{self.base_url}/metrics")
            response.raise_for_status()
        except httpx.HTTPError as exc:
            raise EngineError(f"{self.kind} engine at {self.base_url}: metrics unreadable: {exc}") from exc
        return response.text

    async def sleep(self) -> None:
        await self._post("/sleep")

    async def wake(self) -> None:
        await self._post("/wake_up")

    async def _post(self, path: str, body: object = None, hint: Callable[[int], str] = lambda status: "") -> None:
        """POST to one of the engine's own endpoints (sleep, wake, reset), with a JSON ``body`` if given; an answer
        other than 200 is an ``EngineError``, followed by ``hint(status)``."""
        if not self.sleep_capable:
            raise EngineUnsupported(f"the {self.kind} engine has no sleep mode")
        try:
            response = await self._client.post(f"{self.base_url}{path}", json=body)
        except httpx.HTTPError as exc:
            raise EngineError(f"{self.kind} engine at {self.base_url}: {path} failed: {exc}") from exc
        if response.status_code != 200:
            status = response.status_code
            raise EngineError(f"{self.kind} engine at {self.base_url}: {path} answered {status}{hint(status)}")


class LaunchOptions(TypedDict, total=False):
    """What every launched engine's adapter takes besides its model, port and own options."""

    weights: str | None  # the model's local folder (None: the served name is the folder or a hub id)
    python: str | None  # the engines' Python (``TESSERA_ENGINE_PYTHON``)
    env: Mapping[str, str] | None  # e.g. CUDA_VISIBLE_DEVICES and the engine's own TESSERA_*_ARGS
    host: str
    runner: ProcessRunner | None
    client: httpx.AsyncClient | None


class LaunchedEngine(HttpEngine):
    """An ``HttpEngine`` whose process this adapter launches (``LaunchOptions``)."""

    def __init__(self, model: str, port: int, **options: Unpack[LaunchOptions]) -> None:
        super().__init__(model, port, options.get("host", "127.0.0.1"), options.get("runner"), options.get("client"))
        self.weights = options.get("weights")
        self.python = options.get("python")
        self.env = dict(options.get("env") or {})


def launch_env(env: Mapping[str, str], mem_fraction: float | None = None, python: str | None = None) -> dict[str, str]:
    """What ``engine_exec`` reads besides the engine's own variables: the GPU share as a memory fraction and the
    engines' Python."""
    out = dict(env)
    if mem_fraction is not None:
        out["TESSERA_GPU_MEM_FRACTION"] = repr(mem_fraction)
    if python is not None:
        out["TESSERA_ENGINE_PYTHON"] = python
    return out
