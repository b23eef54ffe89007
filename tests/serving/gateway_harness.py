"""The gateway under uvicorn on a loop in a background thread, with engines started on that loop: the harness of
the gateway's end-to-end tests (``test_gateway_e2e``, ``test_sglang_engine``)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Coroutine
from typing import Any, Protocol, TypeVar

import openai

from tessera.serving.engines.process import free_port
from tessera.serving.engines.sim import SimEngine
from tessera.serving.gateway.app import Gateway, GatewayConfig
from tessera.serving.gateway.auth import StaticKeys
from tessera.serving.gateway.registry import InMemoryRegistry, ModelRoute
from tessera.serving.gateway.serve import uvicorn_server

T = TypeVar("T")


class Engine(Protocol):
    """What the gateway needs of a replica here: where it listens."""

    @property
    def base_url(self) -> str: ...


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

    def add_replica(self, model: str, engine: Engine) -> int:
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
