"""``TransformersServeEngine``: the adapter for ``transformers serve`` (Hugging Face's OpenAI-compatible server).

Two ways to run it:

- **pinned** (a deployed replica, as ``engine_exec`` runs it): ``transformers serve NAME`` loads one model folder at
  start, under the deployed name, keeps it loaded and answers only requests that name it;
- **on demand** (``others`` or ``model_timeout_s`` given): one process serves several model folders, loads each on
  the first request that names it (a cold load), keeps it while requests come (hot), and unloads it after
  ``--model-timeout`` idle seconds (cold again).

Clients send the model's name, and ``transformers serve`` reads the ``model`` field as a folder (or a hub id), so
each folder is linked under its name (``engine_exec.name_link``) and the process runs in that directory.

It has ``/health`` but no ``/metrics``: ``stats`` has nothing to read and answers zeros. Its sleep mode is its model
manager: ``sleep`` is ``POST /reset`` (every loaded model unloaded, the process kept), ``wake`` is
``POST /load_model`` for the adapter's models (the load streamed as server-sent events until ``ready``); ``load``
loads one model by name and says whether it was loaded already.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Unpack

import httpx

from tessera.serving.engine_exec import engine_env, name_link, transformers_argv
from tessera.serving.engines.base import EngineCommand, EngineError, EngineStats
from tessera.serving.engines.http_engine import LaunchedEngine, LaunchOptions, launch_env


class TransformersServeEngine(LaunchedEngine):
    """One ``transformers serve`` process serving ``model`` (``weights``) and, on demand, ``others``; ``env`` may
    carry ``TESSERA_TRANSFORMERS_ARGS``."""

    kind = "transformers"
    sleep_capable = True

    def __init__(
        self,
        model: str,
        port: int,
        *,
        others: Mapping[str, str] | None = None,
        model_timeout_s: int | None = None,
        **options: Unpack[LaunchOptions],
    ) -> None:
        super().__init__(model, port, **options)
        self.others = dict(others or {})
        self.model_timeout_s = model_timeout_s

    @property
    def pinned(self) -> bool:
        return not self.others and self.model_timeout_s is None

    @property
    def models(self) -> dict[str, str | None]:
        """The names it serves, each with its folder (None: the name itself is the folder or a hub id)."""
        return {self.model: self.weights, **self.others}

    def command(self) -> EngineCommand:
        env = launch_env(self.env, python=self.python)
        links = {**os.environ, **env}  # where name_link puts its directory ($TMPDIR)
        cwd = None
        for name, folder in self.models.items():
            if folder is not None:
                cwd = str(name_link(name, folder, links))
        if self.pinned:
            argv = transformers_argv(self.model, self.port, env)
        else:
            argv = transformers_argv(None, self.port, env, self.model_timeout_s)
        return EngineCommand(tuple(argv), engine_env("transformers", env), self.host, self.port, cwd)

    async def stats(self) -> EngineStats:
        return EngineStats()  # no /metrics to read

    async def sleep(self) -> None:
        await self._post("/reset")

    async def wake(self) -> None:
        for name in self.models if not self.pinned else [self.model]:
            await self.load(name)

    async def load(self, name: str) -> bool:
        """Load the model ``name`` (``POST /load_model``) and return once it is ready: True if it was loaded
        already (hot), False if this call loaded it (cold). ``EngineError`` if the load failed."""
        url = f"{self.base_url}/load_model"
        last: dict[str, object] = {}
        try:
            async with self._client.stream("POST", url, json={"model": name}, timeout=None) as response:
                if response.status_code != 200:
                    await response.aread()
                    raise EngineError(f"transformers engine at {url} answered {response.status_code}: {response.text}")
                async for line in response.aiter_lines():
                    if line.startswith("data:"):
                        event = json.loads(line[5:])
                        if isinstance(event, dict) and event.get("status") in ("ready", "error"):
                            last = event
        except httpx.HTTPError as exc:
            raise EngineError(f"transformers engine at {url}: {exc}") from exc
        if last.get("status") != "ready":
            raise EngineError(f"transformers engine could not load {name!r}: {last.get('message', 'no ready event')}")
        return bool(last.get("cached"))
