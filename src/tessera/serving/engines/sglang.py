"""``SGLangEngine``: the adapter for SGLang's OpenAI-compatible server (``python -m sglang.launch_server``).

Same shape as the other adapters (``HttpEngine``): ``/health`` for readiness, ``/metrics`` (SGLang's
``sglang:num_running_reqs``, ``sglang:num_queue_reqs``, ``sglang:token_usage``, read by ``engines.metrics``) for the
router, and SGLang's sleep mode for the warm tier: ``POST /release_memory_occupation`` gives the GPU memory of the
weights and KV cache back while the process lives, ``POST /resume_memory_occupation`` takes it again (both with a
JSON body, ``{}`` for everything). The sleep mode needs the server started with ``--enable-memory-saver``; without
it SGLang refuses the call and ``sleep`` raises ``EngineError`` saying so.

The command line is ``engine_exec``'s, so a replica launched by the controller and one started here are the same
process: ``--mem-fraction-static`` from the GPU share, ``--enable-metrics`` always (the router needs the gauges).

SGLang has no CPU build on PyPI, so on this project's CPU-only CI the adapter is tested against SGLang-format
responses replayed by a small HTTP server (``tests/serving/sglang_replay.py``), not against SGLang itself.
"""

from __future__ import annotations

from typing import Unpack

from tessera.serving.engine_exec import engine_argv, engine_env
from tessera.serving.engines.base import EngineCommand
from tessera.serving.engines.http_engine import LaunchedEngine, LaunchOptions, launch_env

SLEEP_PATH = "/release_memory_occupation"
WAKE_PATH = "/resume_memory_occupation"


class SGLangEngine(LaunchedEngine):
    """One SGLang replica of ``model`` (the served name) with ``weights`` (a local folder)."""

    kind = "sglang"
    sleep_capable = True

    def __init__(
        self, model: str, port: int, *, mem_fraction: float | None = None, **options: Unpack[LaunchOptions]
    ) -> None:
        super().__init__(model, port, **options)
        self.mem_fraction = mem_fraction

    def command(self) -> EngineCommand:
        env = launch_env(self.env, self.mem_fraction, self.python)
        argv = engine_argv("sglang", self.model, self.port, self.weights, env)
        return EngineCommand(tuple(argv), engine_env("sglang", env), self.host, self.port)

    async def sleep(self) -> None:
        await self._post(SLEEP_PATH, {}, lambda status: " (was it started with --enable-memory-saver?)")

    async def wake(self) -> None:
        await self._post(WAKE_PATH, {})
