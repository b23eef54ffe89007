"""``Gateway``: the OpenAI-compatible front, as a plain ASGI application (served by uvicorn).

Why plain ASGI and not a framework's router: the hot path is one dictionary look-up of the path, one parse of the
body (``openai_wire``) and a relay of bytes; the overhead budget is a millisecond at the median at 1,000 streaming
requests/s on two shared cores, and a framework's routing, dependency injection and response classes cost a good
part of it. Disconnects are watched per request (``forward.DisconnectWatch``).

A request goes: API key -> tenant (``auth``; 401) -> body parsed (400 naming the field) -> the model's route from
the registry, visible to the tenant (else 404, the same for a model that exists elsewhere) -> SLO class (the
model's, or the ``x-tessera-slo`` header; an engine with priority scheduling gets it as the body's ``priority``,
``gateway.priority``) -> bound to a replica by the model's router when one takes it, else held
until one does (``binding``, late binding: a replica takes a request while it is below its in-flight cap;
``on_demand`` asks the controller for a replica; 429 + ``Retry-After`` when the hold area is full, 504 when the
bounded wait runs out; 503 + ``Retry-After`` at once, with the reason, while the model's replicas keep failing) ->
forwarded (``forward``). A replica that is gone before the first byte of its answer reached the client (refused,
reset, its process died, even mid-way through the request) is left alone for a second and the request is bound
again, never to that replica, or held until another one is ready, within its deadline (``max_hold_s`` from its
arrival; then 502): an engine's work on it may thus be done twice. Once a byte was sent, a replica's failure ends
the answer (an error event in a stream).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import itertools
import json
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass

from tessera.serving.engines.openai_wire import (
    ChatRequest,
    CompletionRequest,
    EmbeddingRequest,
    OpenAIRequest,
    error_body,
    estimate_tokens,
    parse_request,
)
from tessera.serving.gateway.auth import Authenticator, OpenAccess, visible
from tessera.serving.gateway.binding import Binder, Refusal, not_found, unreachable
from tessera.serving.gateway.forward import DisconnectWatch, Receive, Scope, Send, forward, send_json
from tessera.serving.gateway.hold import HoldArea
from tessera.serving.gateway.metrics import AnswerWatch, GatewayMetrics
from tessera.serving.gateway.priority import PriorityError, forwarded_body
from tessera.serving.gateway.registry import ModelRoute, ReplicaRegistry
from tessera.serving.gateway.replicas import LiveReplicas, ReplicaLoad, prefix_hashes
from tessera.serving.gateway.upstream import RawUpstream, Upstream
from tessera.serving.policies.admission import AdmissionConfig, AdmissionSignals, Shed, admit
from tessera.serving.policies.requests import DEFAULT_SLO_TARGETS, InferenceRequest, SloClass
from tessera.serving.policies.slo_feedback import RecentLatency

SLO_HEADER = b"x-tessera-slo"
ADMISSION = AdmissionConfig()  # the twin's
SESSION_HEADER = b"x-session-id"
_ROUTES: dict[str, type[OpenAIRequest]] = {
    "/v1/chat/completions": ChatRequest,
    "/v1/completions": CompletionRequest,
    "/v1/embeddings": EmbeddingRequest,
}


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    max_hold_s: float = 120.0  # how long a request waits for a replica of its model to take it (then 504)
    max_held_per_model: int = 1024  # held requests per model; one more gets 429
    retry_after_s: int = 2  # the Retry-After of a 429
    scrape_interval_s: float = 0.5  # how often the replicas' /metrics are read
    predicted_output_tokens: int = 256  # the router's guess of a request's output when it sets no max_tokens
    upstream_timeout_s: float = 600.0  # connect and first-answer timeout towards a replica
    chunk_gap_s: float = 300.0  # a streamed answer silent this long (a stalled replica) ends with an error event
    scrape_timeout_s: float = 2.0
    max_body_bytes: int = 16 * 1024 * 1024
    max_prefix_entries: int = 200_000  # per model, the prefix-affinity router's index cap
    on_demand: Callable[[str], None] | None = None  # a model has requests that no replica takes: start one
    # Requests in flight per replica before more wait at the gateway (for models whose route sets none); 0: no cap,
    # requests wait only while their model has no replica ready.
    replica_concurrency: int = 0
    freeze_heap_on_start: bool = False  # the process is this gateway's own: see ``freeze_startup_heap``


def freeze_startup_heap() -> None:
    """Move every object alive now (modules, classes, the server's own state: what lives as long as the process)
    out of the cyclic garbage collector's reach, so that a full collection walks only what was made since. At
    1,000 requests/s a full collection of the whole start-up heap (~50,000 objects) stalled the event loop for
    30-50 ms of CPU a few times a minute, which set the gateway's p99. Once, after start-up, by the process's
    owner (``GatewayConfig.freeze_heap_on_start``, ``tessera up``)."""
    gc.collect()
    gc.freeze()


class Gateway:
    """The ASGI application (see the module docstring)."""

    def __init__(
        self,
        registry: ReplicaRegistry,
        auth: Authenticator | None = None,
        config: GatewayConfig | None = None,
        upstream: Upstream | None = None,
        metrics: GatewayMetrics | None = None,
    ) -> None:
        self.registry = registry
        self.metrics = metrics  # None: no series kept (the overhead benchmark's bare gateway)
        self.auth: Authenticator = auth if auth is not None else OpenAccess()
        self.config = config if config is not None else GatewayConfig()
        self.replicas = LiveReplicas(registry, max_prefix_entries=self.config.max_prefix_entries)
        self.hold: HoldArea[ReplicaLoad] = HoldArea(self.config.max_hold_s, self.config.max_held_per_model)
        config = self.config
        self.binder = Binder(
            registry, self.replicas, self.hold, default_cap=config.replica_concurrency,
            retry_after_s=config.retry_after_s, on_demand=config.on_demand, metrics=metrics,
        )  # fmt: skip
        if upstream is None:
            upstream = RawUpstream(self.config.upstream_timeout_s, chunk_gap_s=self.config.chunk_gap_s)
        self.upstream: Upstream = upstream
        self._scraper: asyncio.Task[None] | None = None
        self._urls: dict[str, set[str]] = {}  # each model's replicas' addresses, to drop the connections of gone ones
        self._ids = itertools.count()
        self.latency = RecentLatency()  # the autoscaler's SLO feedback (streamed answers; ``policies.slo_feedback``)
        registry.subscribe(self._on_change)

    # ------------------------------------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        if self._scraper is None:
            self._scraper = asyncio.ensure_future(self._scrape_forever())
        if self.config.freeze_heap_on_start:
            freeze_startup_heap()

    async def close(self) -> None:
        if self._scraper is not None:
            self._scraper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._scraper
            self._scraper = None
        await self.upstream.aclose()

    async def _scrape_forever(self) -> None:
        """The replicas' metrics every ``scrape_interval_s``; then held requests go where a replica found asleep was
        woken meanwhile."""
        config = self.config
        while True:
            await self.replicas.scrape_once(self.upstream, config.scrape_timeout_s)
            for model in self.hold.models():
                self.binder.drain(model)
            await asyncio.sleep(config.scrape_interval_s)

    def _on_change(self, model: str) -> None:
        urls = {e.base_url for e in self.registry.replicas(model)}
        for gone in self._urls.pop(model, set()) - urls:
            self.upstream.forget(gone)  # its kept-alive connections would wait in CLOSE_WAIT for ever
        if urls:
            self._urls[model] = urls
        route = self.registry.route(model)
        if route is None:
            self.replicas.forget(model)
            self.latency.forget(model)
            self.hold.release(model)  # they find the model gone: 404
        elif route.failing:
            self.hold.release(model)  # answered 503
        else:
            self.binder.drain(model)  # a replica came (or went): held requests go where there is room

    # --------------------------------------------------------------------------------------------------- ASGI
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "lifespan":
            await self._lifespan(receive, send)
            return
        if kind != "http":
            return
        path, method = scope["path"], scope["method"]
        wire = _ROUTES.get(path)
        if wire is not None and method == "POST":
            await self._infer(wire, scope, receive, send)
        elif path == "/v1/models" and method == "GET":
            await self._models(scope, send)
        elif path.startswith("/v1/models/") and method == "GET":
            await self._model(scope, path[len("/v1/models/") :], send)
        elif path == "/health":
            entries = self.replicas.prefix_entries()
            await send_json(send, 200, b'{"status": "ok", "prefix_index_entries": %d}' % entries)
        elif wire is not None or path == "/v1/models" or path.startswith("/v1/models/"):
            await send_json(send, 405, error_body(f"{method} not allowed on {path}", "invalid_request_error", None))
        else:
            await send_json(send, 404, error_body(f"no route {path}", "invalid_request_error", "unknown_url"))

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await self.start()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.close()
                await send({"type": "lifespan.shutdown.complete"})
                return

    def _tenant(self, scope: Scope) -> str | None:
        key = None
        for name, value in scope["headers"]:
            if name == b"authorization":
                scheme, _, token = value.decode("latin-1").partition(" ")
                key = token.strip() if scheme.lower() == "bearer" else None
        return self.auth.tenant(key)

    async def _models(self, scope: Scope, send: Send) -> None:
        tenant = self._tenant(scope)
        if tenant is None:
            await _unauthorized(send)
            return
        data = [_model_object(r) for r in self.registry.routes() if visible(r, tenant)]
        await send_json(send, 200, json.dumps({"object": "list", "data": data}).encode())

    async def _model(self, scope: Scope, name: str, send: Send) -> None:
        """``GET /v1/models/{id}``: the model object as OpenAI answers it, or its 404 (another tenant's model alike)."""
        tenant = self._tenant(scope)
        if tenant is None:
            await _unauthorized(send)
            return
        route = self.registry.route(name)
        if route is None or not visible(route, tenant):
            await _not_found(send, name)
            return
        await send_json(send, 200, json.dumps(_model_object(route)).encode())

    # ------------------------------------------------------------------------------------------------ inference
    async def _infer(self, wire: type[OpenAIRequest], scope: Scope, receive: Receive, send: Send) -> None:
        tenant = self._tenant(scope)
        if tenant is None:
            await _unauthorized(send)
            return
        body = await _read_body(receive, self.config.max_body_bytes)
        if body is None:
            await send_json(send, 413, error_body("the body is too large", "invalid_request_error", None, "body"))
            return
        parsed = parse_request(wire, body)
        if isinstance(parsed, tuple):
            message, param = parsed
            await send_json(send, 400, error_body(message, "invalid_request_error", None, param))
            return
        route = self.registry.route(parsed.model)
        if route is None or not visible(route, tenant):
            await _not_found(send, parsed.model)
            return
        request = self._request(parsed, route, scope)
        if isinstance(request, bytes):
            await send_json(send, 400, request)
            return
        if route.engine_priority:  # the SLO class as the engine's request priority
            try:
                body = forwarded_body(body, parsed, request.slo if route.class_priority else None)
            except PriorityError as exc:
                await send_json(send, 400, error_body(str(exc), "invalid_request_error", None, "priority"))
                return
        task = asyncio.current_task()
        assert task is not None
        watch = DisconnectWatch(receive, task)
        try:
            await self._serve(request, route, scope["path"], body, parsed.stream, send, watch)
        except asyncio.CancelledError:
            if not watch.disconnected:
                raise  # the server is stopping, not the client going away
        finally:
            watch.close()

    def _request(self, parsed: OpenAIRequest, route: ModelRoute, scope: Scope) -> InferenceRequest | bytes:
        """The part-1 request the router and the hold queue see (or the error body of a bad header)."""
        slo, session = route.slo, -1
        for name, value in scope["headers"]:
            if name == SLO_HEADER:
                try:
                    slo = SloClass.parse(value.decode("latin-1"))
                except ValueError as exc:
                    return error_body(str(exc), "invalid_request_error", None, "x-tessera-slo")
            elif name == SESSION_HEADER:
                session = zlib.crc32(value)
        text = parsed.prompt_text()
        now = asyncio.get_running_loop().time()
        return InferenceRequest(
            id=next(self._ids),
            model=route.name,
            arrival_s=now,
            prompt_tokens=estimate_tokens(text),
            output_tokens=parsed.output_limit() or self.config.predicted_output_tokens,
            slo=slo,
            deadline_s=now + DEFAULT_SLO_TARGETS[slo].ttft_s,
            session=session,
            prefix=prefix_hashes(text) if route.router == "prefix-affinity" else (),
        )

    async def _serve(
        self, request: InferenceRequest, route: ModelRoute, path: str, body: bytes, stream: bool, send: Send,
        watch: DisconnectWatch,
    ) -> None:  # fmt: skip
        loop = asyncio.get_running_loop()
        binder = self.binder
        self.latency.arrived(route.name, request.prompt_tokens, self.config.predicted_output_tokens)  # as the twin
        if route.admission and request.slo is SloClass.BATCH and (shed := self._shed(request)) is not None:
            await self._refuse(request, shed, send)
            return
        avoid: frozenset[int] = frozenset()  # replicas found gone for this request
        expires_s = request.arrival_s + self.config.max_hold_s
        while True:
            bound = await binder.bind(request, avoid, expires_s)
            if isinstance(bound, Refusal):
                await self._refuse(request, bound, send)
                return
            if await self._forward_counted(bound, request, path, body, stream, send, watch):
                return
            # Gone before the first byte reached the client: bound again elsewhere, or held for a replica.
            avoid = binder.gone(bound, request, avoid)
            if loop.time() >= expires_s:
                await self._refuse(request, unreachable(request.model, len(avoid), "before its deadline"), send)
                return

    def _shed(self, request: InferenceRequest) -> Refusal | None:
        """Admission (``policies.admission``, as the twin's): a batch request is refused (429) when its model is
        overloaded: too many requests wait per ready replica, held here or queued in the engines."""
        loads = self.replicas.loads(request.model)
        queued = self.hold.held(request.model) + sum(load.scraped.waiting for load in loads)
        verdict = admit(request, AdmissionSignals(len(loads), queued, 0.0), ADMISSION)
        if not isinstance(verdict, Shed):
            return None
        retry = [(b"retry-after", str(self.config.retry_after_s).encode())]
        return Refusal(429, error_body(verdict.reason, "rate_limit_error", "shed"), retry)

    async def _refuse(self, request: InferenceRequest, refusal: Refusal, send: Send) -> None:
        await send_json(send, refusal.status, refusal.body, refusal.headers)
        if self.metrics is not None and refusal.status == 502:
            now = asyncio.get_running_loop().time()
            self.metrics.answered(request.model, request.slo.name.lower(), 502, request.arrival_s, now, None, now, 0)

    async def _forward_counted(
        self, load: ReplicaLoad, request: InferenceRequest, path: str, body: bytes, stream: bool, send: Send,
        watch: DisconnectWatch,
    ) -> bool:  # fmt: skip
        """Forward to ``load``'s replica, where ``request`` is reserved (``Binder.bind``); False when the replica
        was gone before the first byte of its answer (nothing was sent to the client)."""
        loop = asyncio.get_running_loop()
        metrics = self.metrics
        if metrics is not None:
            sent_s, answer = loop.time(), AnswerWatch(send, loop)
            send = answer.send
        reached = True  # an attempt that reached no replica is not an answer: the request is bound again
        try:
            reached = await forward(self.upstream, load, path, body, stream, send, watch)
            return reached
        finally:
            self.binder.unreserve(load, request)
            if metrics is not None and reached:
                end_s = loop.time()
                metrics.answered(
                    request.model, request.slo.name.lower(), answer.status, request.arrival_s, sent_s, answer.first_s,
                    end_s, answer.chunks,
                )  # fmt: skip
                if stream and answer.status == 200 and answer.first_s is not None:  # a plain answer has no TTFT
                    tpot = (end_s - answer.first_s) / (answer.chunks - 1) if answer.chunks > 1 else None
                    self.latency.served(
                        request.model, time.time(), request.slo, answer.first_s - request.arrival_s, tpot
                    )


async def _read_body(receive: Receive, limit: int) -> bytes | None:
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return b""
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


async def _unauthorized(send: Send) -> None:
    body = error_body(
        "a valid API key is required (Authorization: Bearer KEY)", "invalid_request_error", "invalid_api_key"
    )
    await send_json(send, 401, body, [(b"www-authenticate", b"Bearer")])


async def _not_found(send: Send, model: str) -> None:
    refusal = not_found(model)
    await send_json(send, refusal.status, refusal.body)


def _model_object(route: ModelRoute) -> dict[str, object]:
    """A model as OpenAI's API shows one (``/v1/models``): its owner is the tenant that deployed it."""
    return {"id": route.name, "object": "model", "created": route.created_s, "owned_by": route.tenant}
