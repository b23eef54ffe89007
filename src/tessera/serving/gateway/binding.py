"""Binding requests to replicas, late: the gateway's dispatcher (``Binder``), between the router and the hold area.

A request is bound to a replica only when that replica may take it (``ReplicaLoad.takes``: awake, not left alone
after a failed connection, and below the model's in-flight cap, ``ModelRoute.replica_concurrency`` or else
``GatewayConfig.replica_concurrency``; 0 is no cap). Until then it is held (``hold``), and held requests go most
urgent first, each where the model's router sends it among the replicas that may take it, whenever that can change
(``drain``): a replica becomes ready (the registry changed), a request ends on one (``unreserve``), a replica left
alone after a failed connection may be tried again, a scrape finds one awake again. A burst held while a model
starts from zero is thus spread over its replicas as each becomes ready, rather than all sent to the first, and a
new request never overtakes a more urgent one that waits.

A request whose replica was gone before the first byte of its answer reached the client (``gone``) is bound again,
never to that replica (its id joins the request's ``avoid``), or held until another one is ready, within its
deadline (``expires_s``); then it is answered 502.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

from tessera.serving.engines.openai_wire import error_body
from tessera.serving.gateway.hold import Held, HoldArea, HoldExpired, HoldOverflow
from tessera.serving.gateway.metrics import GatewayMetrics
from tessera.serving.gateway.registry import ModelRoute, ReplicaRegistry
from tessera.serving.gateway.replicas import LiveReplicas, ReplicaLoad
from tessera.serving.policies.engine_parts import EngineConfig
from tessera.serving.policies.requests import InferenceRequest

PREDICTED_OUTPUT_TOKENS = EngineConfig(kv_blocks=1).predicted_output_tokens  # what the twin's has_room adds
UNREACHABLE_BACKOFF_S = 1.0  # a replica that could not be reached gets no request for this long

Headers = list[tuple[bytes, bytes]]


@dataclass(frozen=True, slots=True)
class Refusal:
    """An answer instead of a replica: the status, OpenAI's error body, headers."""

    status: int
    body: bytes
    headers: Headers | None = None


class Binder:
    """See the module docstring. Call it on the event loop thread only."""

    def __init__(
        self,
        registry: ReplicaRegistry,
        replicas: LiveReplicas,
        hold: HoldArea[ReplicaLoad],
        *,
        default_cap: int = 0,
        retry_after_s: int = 2,
        on_demand: Callable[[str], None] | None = None,
        metrics: GatewayMetrics | None = None,
    ) -> None:
        self.registry = registry
        self.replicas = replicas
        self.hold = hold
        self.default_cap = default_cap
        self.retry_after_s = retry_after_s
        self.on_demand = on_demand  # a model has requests that no replica takes: the controller may start one
        self.metrics = metrics
        hold.abandoned = self._abandoned

    def cap(self, route: ModelRoute) -> int:
        return route.replica_concurrency or self.default_cap

    # ------------------------------------------------------------------------------------------------- bookings
    @staticmethod
    def reserve(load: ReplicaLoad, request: InferenceRequest) -> None:
        """Count ``request`` in ``load``'s in-flight figures (it is bound there)."""
        load.inflight += 1
        load.inflight_tokens += request.prompt_tokens + request.output_tokens
        load.inflight_prompt_tokens += request.prompt_tokens

    def unreserve(self, load: ReplicaLoad, request: InferenceRequest) -> None:
        """``request`` left ``load``'s replica (done, failed, or its client left): its room goes to a held one."""
        load.inflight -= 1
        load.inflight_tokens -= request.prompt_tokens + request.output_tokens
        load.inflight_prompt_tokens -= request.prompt_tokens
        if self.hold.held(request.model):
            self.drain(request.model)

    def _abandoned(self, held: Held[ReplicaLoad], load: ReplicaLoad) -> None:
        self.unreserve(load, held.request)

    # ------------------------------------------------------------------------------------------------- binding
    async def bind(self, request: InferenceRequest, avoid: frozenset[int], expires_s: float) -> ReplicaLoad | Refusal:
        """A replica for ``request``, reserved (``unreserve`` it once the request leaves it), or the answer to give
        instead: 404 (the model is gone), 503 (it is failing), 429 (too many held), 504 (held too long), 502 (the
        replicas it was sent to were gone and none other took it in time)."""
        loop = asyncio.get_running_loop()
        model = request.model
        while True:
            route = self.registry.route(model)
            if route is None:
                return not_found(model)
            if avoid and loop.time() >= expires_s:
                return unreachable(model, len(avoid), "before its deadline")
            waiting = self.hold.held(model)
            if not waiting:  # nobody more urgent waits: straight to a replica that takes it, if any
                load = self._pick(request, route, loop.time(), avoid)
                if load is not None:
                    self.reserve(load, request)
                    return load
            if route.failing:
                return failing(route)
            if self.on_demand is not None:
                self.on_demand(model)
            try:
                held = self.hold.add(request, avoid, expires_s)
            except HoldOverflow as exc:
                retry = [(b"retry-after", str(self.retry_after_s).encode())]
                return Refusal(429, error_body(str(exc), "rate_limit_error", "model_starting"), retry)
            if waiting:
                self.drain(model)  # its turn may be now: the most urgent held requests go first
            try:
                bound = await self.hold.settle(held)
            except HoldExpired as exc:
                if avoid:
                    return unreachable(model, len(avoid), f"and no other took it: {exc}")
                return Refusal(504, error_body(str(exc), "timeout_error", "model_not_ready"))
            if bound is not None:
                return bound
            # Let go unbound: the model's route changed (gone, failing); look again.

    def drain(self, model: str) -> None:
        """Bind held requests of ``model``, most urgent first, while its replicas take them."""
        hold = self.hold
        if not hold.held(model):
            return
        route = self.registry.route(model)
        if route is None or route.failing:
            hold.release(model)  # they answer 404 or 503
            return
        now = asyncio.get_running_loop().time()
        cap = self.cap(route)
        skipped: list[Held[ReplicaLoad]] = []
        while (held := hold.pop_urgent(model)) is not None:
            load = self._pick(held.request, route, now, held.avoid)
            if load is None:
                skipped.append(held)
                if not held.avoid or not self.replicas.any_takes(model, now, cap, need_tokens(route, held.request)):
                    break
                continue  # only the replicas it found gone take requests: a less urgent one may go
            self.reserve(load, held.request)
            hold.bind(held, load)
        for held in skipped:
            hold.put_back(held)

    def gone(self, load: ReplicaLoad, request: InferenceRequest, avoid: frozenset[int]) -> frozenset[int]:
        """``request``'s replica was gone before its answer's first byte: the replica is left alone for
        ``UNREACHABLE_BACKOFF_S`` (held requests may try it after that), the retry is counted, and the request's
        ``avoid`` grows by it."""
        loop = asyncio.get_running_loop()
        load.unreachable_until_s = loop.time() + UNREACHABLE_BACKOFF_S
        loop.call_at(load.unreachable_until_s, self.drain, request.model)
        if self.metrics is not None:
            self.metrics.retried(request.model, request.slo.name.lower())
        return avoid | {load.endpoint.replica}

    def _pick(
        self, request: InferenceRequest, route: ModelRoute, now_s: float, avoid: frozenset[int]
    ) -> ReplicaLoad | None:
        need = need_tokens(route, request)
        if self.metrics is None:
            return self.replicas.pick(request, route.router, now_s, self.cap(route), avoid, need)
        picked_at = time.perf_counter()
        load = self.replicas.pick(request, route.router, now_s, self.cap(route), avoid, need)
        self.metrics.decision.observe(time.perf_counter() - picked_at)
        return load


def need_tokens(route: ModelRoute, request: InferenceRequest) -> int:
    """The KV cache ``request`` needs of a replica that takes it under the route's late binding (0: not asked): its
    prompt and a typical answer (the engine model's prediction), as the twin's late binding asks."""
    return request.prompt_tokens + PREDICTED_OUTPUT_TOKENS if route.kv_room else 0


def not_found(model: str) -> Refusal:
    message = f"The model `{model}` does not exist or you do not have access to it."
    return Refusal(404, error_body(message, "invalid_request_error", "model_not_found", "model"))


def failing(route: ModelRoute) -> Refusal:
    message = f"model {route.name!r} is failing: its replicas keep ending on their own ({route.failing})"
    retry = [(b"retry-after", str(max(1, route.retry_after_s)).encode())]
    return Refusal(503, error_body(message, "api_error", "model_failing"), retry)


def unreachable(model: str, tried: int, why: str) -> Refusal:
    message = f"no replica of model {model!r} could be reached ({tried} tried {why})"
    return Refusal(502, error_body(message, "api_error", "replica_unreachable"))
