"""``SimEngine``: the adapter for the sim engine (``sim_server``), the first ``EngineAdapter``."""

from __future__ import annotations

import sys

import httpx

from tessera.serving.engines.base import EngineCommand, ProcessRunner
from tessera.serving.engines.http_engine import HttpEngine
from tessera.serving.engines.sim_server import DEFAULT_PERF


class SimEngine(HttpEngine):
    """One sim replica: ``python -m tessera.serving.engines.sim_server`` with these options."""

    kind = "sim"
    sleep_capable = True

    def __init__(
        self,
        model: str,
        port: int,
        *,
        perf: str = DEFAULT_PERF,
        speedup: float = 1.0,
        default_output_tokens: int = 16,
        host: str = "127.0.0.1",
        runner: ProcessRunner | None = None,
        client: httpx.AsyncClient | None = None,
        python: str = sys.executable,
    ) -> None:
        super().__init__(model, port, host, runner, client)
        self.perf = perf
        self.speedup = speedup
        self.default_output_tokens = default_output_tokens
        self.python = python

    def command(self) -> EngineCommand:
        argv = (
            self.python,
            "-m",
            "tessera.serving.engines.sim_server",
            "--model",
            self.model,
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--perf",
            self.perf,
            "--speedup",
            repr(self.speedup),
            "--default-output-tokens",
            str(self.default_output_tokens),
        )
        return EngineCommand(argv, {}, self.host, self.port)
