"""The OpenAI-compatible gateway inside ``tessera up``: served under ``/openai`` on the server's own port, with the
server's tokens as API keys, its registry kept in step with the store by the serving controller, and the gateway's
requests as the controller's demand. The server and the gateway are siblings that do not import each other; this
module (the CLI layer, above both) composes them through ``server.up.ServingFront``.

- ``with_gateway(app, gateway)``: one ASGI application; a path under ``/openai/`` goes to the gateway (prefix
  removed), anything else to the control plane's FastAPI app. A string comparison per request, no framework.
- ``TokenAuth``: a bearer token is looked up in the store (``server.auth``) and cached for ``ttl_s`` so that a
  stream of requests does not hit the database each time; the cache is dropped whenever the server revokes a token
  (``Store.revocations``), so a revoked token stops working at once.
- ``serving_front``: the gateway, its registry (``gateway.bridge.LiveRegistry``, which looks models up in the
  store) and its ``GatewayBridge`` to the serving controller (demand, replicas proven before they are registered,
  which replicas are ready), wired to this server's store, loop and backend; and the window of each model's recent
  requests that the gateway's metrics record (``serving.model_stats``, read by ``GET /v1/models/NAME/stats``).
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import os
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from typing import Any

from tessera.server.auth import principal_for
from tessera.server.context import ServerContext
from tessera.server.serving_plane import deployed, replica_owns
from tessera.server.store import served
from tessera.server.up import ServingFront
from tessera.serving.gateway.app import Gateway, GatewayConfig
from tessera.serving.gateway.auth import ANY_TENANT
from tessera.serving.gateway.bridge import GatewayBridge, LiveRegistry, route_of
from tessera.serving.gateway.metrics import GatewayMetrics
from tessera.serving.gateway.registry import ModelRoute
from tessera.serving.model_stats import WINDOW_S, ModelWindow, WindowConfig

PREFIX = "/openai"
Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class TokenAuth:
    def __init__(self, ctx: ServerContext, ttl_s: float = 5.0) -> None:
        self.ctx = ctx
        self.ttl_s = ttl_s
        self._cache: dict[bytes, tuple[str | None, float]] = {}
        self._revocations = ctx.store.revocations

    def tenant(self, api_key: str | None) -> str | None:
        if not api_key:
            return None
        if self._revocations != self.ctx.store.revocations:  # a token was revoked since: ask the store again
            self._revocations = self.ctx.store.revocations
            self._cache.clear()
        digest = hashlib.sha256(api_key.encode()).digest()
        now = time.monotonic()
        cached = self._cache.get(digest)
        if cached is not None and cached[1] > now:
            return cached[0]
        caller = principal_for(self.ctx.store, f"Bearer {api_key}", self.ctx.clock())
        tenant = None if caller is None else ANY_TENANT if caller.is_admin else caller.tenant
        if len(self._cache) > 10_000:
            self._cache.clear()
        self._cache[digest] = (tenant, now + self.ttl_s)
        return tenant


def with_gateway(app: ASGIApp, gateway: Gateway, bridge: GatewayBridge) -> ASGIApp:
    """``app`` with the gateway under ``/openai`` (see the module docstring)."""

    def loop_ready(loop: asyncio.AbstractEventLoop) -> None:
        bridge.loop = loop

    async def dispatch(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith(PREFIX + "/"):
            inner = dict(scope)
            inner["path"] = scope["path"][len(PREFIX) :]
            inner["root_path"] = scope.get("root_path", "") + PREFIX
            await gateway(inner, receive, send)
            return
        if scope["type"] == "lifespan":
            await _lifespan(gateway, loop_ready, receive, send)
            return
        await app(scope, receive, send)

    return dispatch


async def _lifespan(
    gateway: Gateway, loop_ready: Callable[[asyncio.AbstractEventLoop], None], receive: Receive, send: Send
) -> None:
    """The gateway starts and stops with the server (its upstream client and scraper); ``loop_ready`` learns the
    event loop the registry lives on. The control plane's app has no lifespan work of its own."""
    message = await receive()
    assert message["type"] == "lifespan.startup"
    await gateway.start()
    loop_ready(asyncio.get_running_loop())
    await send({"type": "lifespan.startup.complete"})
    await receive()  # lifespan.shutdown
    await gateway.close()
    await send({"type": "lifespan.shutdown.complete"})


MAX_HOLD_ENV = "TESSERA_GATEWAY_MAX_HOLD_S"
CHUNK_GAP_ENV = "TESSERA_GATEWAY_CHUNK_GAP_S"
STATS_WINDOW_ENV = "TESSERA_MODEL_STATS_WINDOW_S"
DEFAULTS = GatewayConfig()


def env_seconds(env: Mapping[str, str], name: str, default: float) -> float:
    """A positive number of seconds from the environment variable ``name``, else ``default``. The gateway's waits:
    ``TESSERA_GATEWAY_MAX_HOLD_S``, how long a request waits for a replica of its model (a real engine's cold start,
    e.g. vLLM's on a busy CPU, can take minutes); ``TESSERA_GATEWAY_CHUNK_GAP_S``, how long a streamed answer that
    has begun may stay silent before it is ended with an error event (a stalled replica);
    ``TESSERA_MODEL_STATS_WINDOW_S``, how far back the models' request statistics look (``serving.model_stats``)."""
    try:
        value = float(env.get(name, ""))
    except ValueError:
        return default
    return value if value > 0 and math.isfinite(value) else default


def serving_front(ctx: ServerContext) -> ServingFront:
    """The gateway of ``tessera up`` and its bridge to the serving controller (a request for a model with no
    ready replica wakes the controller at once)."""

    def lookup(name: str) -> ModelRoute | None:
        row = served.model(ctx.store, name)
        return route_of(deployed(row), ctx.serving_setup) if row is not None and not row.deleting else None

    registry = LiveRegistry(lookup)
    wake = threading.Event()
    window = ModelWindow(WindowConfig.over(env_seconds(os.environ, STATS_WINDOW_ENV, WINDOW_S)))
    metrics = GatewayMetrics(window=window)
    config = GatewayConfig(
        on_demand=lambda model: wake.set(),
        max_hold_s=env_seconds(os.environ, MAX_HOLD_ENV, DEFAULTS.max_hold_s),
        chunk_gap_s=env_seconds(os.environ, CHUNK_GAP_ENV, DEFAULTS.chunk_gap_s),
        freeze_heap_on_start=True,
    )
    gateway = Gateway(registry, TokenAuth(ctx), config, metrics=metrics)
    bridge = GatewayBridge(
        registry,
        gateway,
        wake,
        lambda workload_id, pid: replica_owns(ctx, workload_id, pid),
        ctx.model_health.get,
        ctx.serving_setup,
    )
    return ServingFront(
        wrap=lambda app: with_gateway(app, gateway, bridge), demand=bridge, sinks=[bridge], wake=wake,
        collectors=[metrics.registry], readiness=bridge.ready, window=window,
    )  # fmt: skip
