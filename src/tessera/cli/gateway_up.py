"""The OpenAI-compatible gateway inside ``tessera up``: served under ``/openai`` on the server's own port, with the
server's tokens as API keys, its registry kept in step with the store by the serving controller, and the gateway's
requests as the controller's demand. The server and the gateway are siblings that do not import each other; this
module (the CLI layer, above both) composes them through ``server.up.ServingFront``.

- ``with_gateway(app, gateway)``: one ASGI application; a path under ``/openai/`` goes to the gateway (prefix
  removed), anything else to the control plane's FastAPI app. A string comparison per request, no framework.
- ``TokenAuth``: a bearer token is looked up in the store (``server.auth``) and cached for ``ttl_s`` so that a
  stream of requests does not hit the database each time; the cache is dropped whenever the server revokes a token
  (``Store.revocations``), so a revoked token stops working at once.
- ``GatewayBridge``: the controller's ``DemandSource`` (requests in flight and held, per model) and its replica sink
  (``publish``: the models deployed and their running replicas; a replica joins the registry once it is proven,
  ``replica_probe.prove_replica``: its engine answers ``/health`` and the process listening on its socket is the
  replica workload's own). The registry is changed only on the gateway's event loop (``call_soon_threadsafe``).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import os
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, MutableMapping, Sequence
from typing import Any

from tessera.server.auth import principal_for
from tessera.server.context import ServerContext
from tessera.server.serving_plane import deployed, replica_owns
from tessera.server.store import served
from tessera.server.up import ServingFront
from tessera.serving.controller import Demand, ReplicaView
from tessera.serving.gateway.app import Gateway, GatewayConfig
from tessera.serving.gateway.auth import ANY_TENANT
from tessera.serving.gateway.metrics import GatewayMetrics
from tessera.serving.gateway.registry import InMemoryRegistry, ModelRoute
from tessera.serving.gateway.replica_probe import prove_replica
from tessera.serving.policies.requests import SloClass
from tessera.serving.replica_health import ModelHealth
from tessera.serving.replicas import DeployedModel

log = logging.getLogger(__name__)

PREFIX = "/openai"
Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
HEALTH_TIMEOUT_S = 0.5


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


MISS_TTL_S = 0.25  # an unknown model name is looked up in the store again after this long


class LiveRegistry(InMemoryRegistry):
    """The gateway's registry, fed by the controller each tick, that also looks a model it does not know up in the
    store: a model deployed a moment ago is served (held until a replica is up), never a 404, even before the
    controller's next tick. Names found unknown are remembered for ``MISS_TTL_S`` so that a flood of made-up
    names costs the store one read per name and interval."""

    def __init__(self, lookup: Callable[[str], ModelRoute | None]) -> None:
        super().__init__()
        self.lookup = lookup
        self.looked_up: dict[str, float] = {}  # route deployed by a look-up -> when (monotonic)
        self._misses: dict[str, float] = {}

    def route(self, model: str) -> ModelRoute | None:
        found = super().route(model)
        if found is not None:
            return found
        now = time.monotonic()
        if self._misses.get(model, 0.0) > now:
            return None
        found = self.lookup(model)
        if found is None:
            if len(self._misses) > 10_000:
                self._misses.clear()
            self._misses[model] = now + MISS_TTL_S
            return None
        self.looked_up[model] = now
        self.deploy(found)
        return found


def route_of(model: DeployedModel, health: ModelHealth | None = None, now_s: float = 0.0) -> ModelRoute:
    """The gateway's route of ``model``: failing (answered 503 at once) while its replicas keep failing."""
    failing = health.last_error or "no replica is ready" if health is not None and health.failing else ""
    retry_after_s = 0
    if failing and health is not None and health.retry_at_s is not None:
        retry_after_s = max(1, math.ceil(health.retry_at_s - now_s))
    slo = SloClass.parse(model.slo)
    return ModelRoute(model.name, model.tenant, slo, "least-load", int(model.created_s), failing, retry_after_s)


ReplicaKey = tuple[int, int]  # (workload id, attempt): a replica restarted in place is proven again
Endpoint = tuple[str, int | None]  # (address, the proven listener's pid)


class GatewayBridge:
    def __init__(
        self,
        registry: LiveRegistry,
        gateway: Gateway,
        wake: threading.Event,
        owns: Callable[[int, int], bool],
        health: Callable[[int], ModelHealth | None] = lambda model_id: None,
    ) -> None:
        self.registry = registry
        self.gateway = gateway
        self.wake = wake  # set when a request waits for a model with no replica
        self.owns = owns  # (workload id, pid): is that process the replica's own
        self.health = health  # a model's health as the serving controller saw it last
        self.proven: frozenset[ReplicaKey] = frozenset()  # the replicas registered (or being registered) now
        self.loop: asyncio.AbstractEventLoop | None = None
        self._endpoints: dict[str, dict[ReplicaKey, int]] = {}  # model -> replica -> registry replica id
        self._last_busy: dict[str, float] = {}
        self._refused: dict[ReplicaKey, str] = {}  # why a replica was not registered (logged once)

    # ------------------------------------------------------------------------------------ the demand source
    def take_demand(self, model_key: str) -> Demand:
        name = model_key.partition("/")[2] or model_key
        in_flight = sum(load.inflight for load in self.gateway.replicas.loads(name))
        held = self.gateway.hold.held(name)
        now = time.time()
        if in_flight or held:
            self._last_busy[name] = now
        return Demand(in_flight=in_flight, held=held, last_request_s=self._last_busy.get(name))

    def ready(self, workload_id: int, attempt: int) -> bool:
        """Whether that replica was proven and registered (the controller's ``readiness``)."""
        return (workload_id, attempt) in self.proven

    # -------------------------------------------------------------------------------------- the replica sink
    def publish(self, models: Sequence[DeployedModel], replicas: dict[int, list[ReplicaView]]) -> None:
        """Routes for the models deployed; endpoints for their running replicas whose engines answer."""
        if self.loop is None:
            return
        snapshot_s, now_s = time.monotonic(), time.time()
        wanted: dict[str, dict[ReplicaKey, Endpoint | None]] = {}
        routes = []
        for m in models:
            if m.deleting:
                continue
            routes.append(route_of(m, self.health(m.id), now_s))
            known = self._endpoints.get(m.name, {})
            ready: dict[ReplicaKey, Endpoint | None] = {}
            for r in replicas.get(m.id, []):
                if not r.running or r.stopping or r.address is None:
                    continue
                key = (r.workload_id, r.attempt)
                if key in known:
                    ready[key] = None  # registered already
                elif (endpoint := self._prove(key, r.address)) is not None:
                    ready[key] = endpoint
            wanted[m.name] = ready
        self.proven = frozenset(key for ready in wanted.values() for key in ready)
        self.loop.call_soon_threadsafe(self._apply, routes, wanted, snapshot_s)

    def _prove(self, key: ReplicaKey, address: str) -> Endpoint | None:
        """The replica's address and listener once it is proven (``prove_replica``), else None (tried again at the
        next publish; an impostor at its address is logged once)."""
        proof = prove_replica(address, lambda pid: self.owns(key[0], pid), HEALTH_TIMEOUT_S)
        if proof.ready:
            self._refused.pop(key, None)
            return address, proof.listener_pid
        if proof.listener_pid is not None and self._refused.get(key) != proof.reason:
            self._refused[key] = proof.reason
            log.warning("replica workload %d at %s not registered: %s", key[0], address, proof.reason)
        if len(self._refused) > 10_000:
            self._refused.clear()
        return None

    def _apply(
        self, routes: list[ModelRoute], wanted: dict[str, dict[ReplicaKey, Endpoint | None]], snapshot_s: float
    ) -> None:
        """On the gateway's loop: the registry becomes ``routes`` with the ``wanted`` endpoints. A route the
        registry looked up after this snapshot was read stays (the snapshot is older than its deployment)."""
        looked_up = self.registry.looked_up
        for gone in {r.name for r in self.registry.routes()} - {r.name for r in routes}:
            if looked_up.get(gone, -math.inf) >= snapshot_s:
                continue
            self.registry.undeploy(gone)
            self._endpoints.pop(gone, None)
            looked_up.pop(gone, None)
        for route in routes:
            if self.registry.route(route.name) != route:
                self.registry.deploy(route)
            known = self._endpoints.setdefault(route.name, {})
            for key in list(known):
                if key not in wanted[route.name]:
                    self.registry.remove_replica(route.name, known.pop(key))
            for key, endpoint in wanted[route.name].items():
                if key not in known and endpoint is not None:
                    known[key] = self.registry.add_replica(route.name, *endpoint)

    def close(self) -> None:
        pass


MAX_HOLD_ENV = "TESSERA_GATEWAY_MAX_HOLD_S"
CHUNK_GAP_ENV = "TESSERA_GATEWAY_CHUNK_GAP_S"
DEFAULTS = GatewayConfig()


def env_seconds(env: Mapping[str, str], name: str, default: float) -> float:
    """A positive number of seconds from the environment variable ``name``, else ``default``. The gateway's waits:
    ``TESSERA_GATEWAY_MAX_HOLD_S``, how long a request waits for a replica of its model (a real engine's cold start,
    e.g. vLLM's on a busy CPU, can take minutes); ``TESSERA_GATEWAY_CHUNK_GAP_S``, how long a streamed answer that
    has begun may stay silent before it is ended with an error event (a stalled replica)."""
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
        return route_of(deployed(row)) if row is not None and not row.deleting else None

    registry = LiveRegistry(lookup)
    wake = threading.Event()
    metrics = GatewayMetrics()
    config = GatewayConfig(
        on_demand=lambda model: wake.set(),
        max_hold_s=env_seconds(os.environ, MAX_HOLD_ENV, DEFAULTS.max_hold_s),
        chunk_gap_s=env_seconds(os.environ, CHUNK_GAP_ENV, DEFAULTS.chunk_gap_s),
        freeze_heap_on_start=True,
    )
    gateway = Gateway(registry, TokenAuth(ctx), config, metrics=metrics)
    bridge = GatewayBridge(
        registry, gateway, wake, lambda workload_id, pid: replica_owns(ctx, workload_id, pid), ctx.model_health.get
    )
    return ServingFront(
        wrap=lambda app: with_gateway(app, gateway, bridge), demand=bridge, sinks=[bridge], wake=wake,
        close=bridge.close, collectors=[metrics.registry], readiness=bridge.ready,
    )  # fmt: skip
