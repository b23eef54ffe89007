"""``Gateway``: the OpenAI-compatible front, as a plain ASGI application (served by uvicorn).

Why plain ASGI and not a framework's router: the hot path is one dictionary look-up of the path, one parse of the
body (``openai_wire``) and a relay of bytes; the overhead budget is a millisecond at the median at 1,000 streaming
requests/s on two shared cores, and a framework's routing, dependency injection and response classes cost a good
part of it. Disconnects are watched per request (``forward.DisconnectWatch``).

A request goes: API key -> tenant (``auth``; 401) -> body parsed (400 naming the field) -> the model's route from
the registry, visible to the tenant (else 404, the same for a model that exists elsewhere) -> SLO class (the
model's, or the ``x-tessera-slo`` header) -> a replica picked by the model's router (``replicas``) or, with none
ready, held (``hold``; ``on_demand`` asks the controller for one; 429 + ``Retry-After`` when the hold queue is
full, 504 when the bounded wait runs out; 503 + ``Retry-After`` at once, with the reason, while the model's
replicas keep failing) -> forwarded (``forward``; a replica that cannot be reached is left
alone for a second and the request goes to another, or waits for the registry to change when none is left, 502
when ``MAX_REPLICA_TRIES`` could not be reached).
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
from tessera.serving.gateway.forward import DisconnectWatch, Message, Receive, Scope, Send, forward, send_json
from tessera.serving.gateway.hold import HoldArea, HoldExpired, HoldOverflow
from tessera.serving.gateway.metrics import GatewayMetrics
from tessera.serving.gateway.registry import ModelRoute, ReplicaRegistry
from tessera.serving.gateway.replicas import LiveReplicas, ReplicaLoad, prefix_hashes
from tessera.serving.gateway.upstream import RawUpstream, Upstream
from tessera.serving.policies.requests import DEFAULT_SLO_TARGETS, InferenceRequest, SloClass

MAX_REPLICA_TRIES = 3  # replicas tried for one request when they cannot be reached
UNREACHABLE_BACKOFF_S = 1.0  # a replica that could not be reached gets no request for this long
SLO_HEADER = b"x-tessera-slo"
SESSION_HEADER = b"x-session-id"
_ROUTES: dict[str, type[OpenAIRequest]] = {
    "/v1/chat/completions": ChatRequest,
    "/v1/completions": CompletionRequest,
    "/v1/embeddings": EmbeddingRequest,
}


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    max_hold_s: float = 120.0  # how long a request waits for a replica of its model (then 504)
    max_held_per_model: int = 1024  # held requests per model; one more gets 429
    retry_after_s: int = 2  # the Retry-After of a 429
    scrape_interval_s: float = 0.5  # how often the replicas' /metrics are read
    predicted_output_tokens: int = 256  # the router's guess of a request's output when it sets no max_tokens
    upstream_timeout_s: float = 600.0  # connect and first-answer timeout towards a replica
    chunk_gap_s: float = 300.0  # a streamed answer silent this long (a stalled replica) ends with an error event
    scrape_timeout_s: float = 2.0
    max_body_bytes: int = 16 * 1024 * 1024
    max_prefix_entries: int = 200_000  # per model, the prefix-affinity router's index cap
    on_demand: Callable[[str], None] | None = None  # a model has requests and no ready replica: start one
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
        self.hold = HoldArea(self.config.max_hold_s, self.config.max_held_per_model)
        if upstream is None:
            upstream = RawUpstream(self.config.upstream_timeout_s, chunk_gap_s=self.config.chunk_gap_s)
        self.upstream: Upstream = upstream
        self._scraper: asyncio.Task[None] | None = None
        self._urls: dict[str, set[str]] = {}  # each model's replicas' addresses, to drop the connections of gone ones
        self._ids = itertools.count()
        registry.subscribe(self._on_change)

    # ------------------------------------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        if self._scraper is None:
            config = self.config
            scrape = self.replicas.scrape_forever(self.upstream, config.scrape_interval_s, config.scrape_timeout_s)
            self._scraper = asyncio.ensure_future(scrape)
        if self.config.freeze_heap_on_start:
            freeze_startup_heap()

    async def close(self) -> None:
        if self._scraper is not None:
            self._scraper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._scraper
            self._scraper = None
        await self.upstream.aclose()

    def _on_change(self, model: str) -> None:
        urls = {e.base_url for e in self.registry.replicas(model)}
        for gone in self._urls.pop(model, set()) - urls:
            self.upstream.forget(gone)  # its kept-alive connections would wait in CLOSE_WAIT for ever
        if urls:
            self._urls[model] = urls
        route = self.registry.route(model)
        if route is None:
            self.replicas.forget(model)
            self.hold.release(model)  # they find the model gone: 404
        elif urls or route.failing:
            self.hold.release(model)  # a replica to go to, or a failing model to answer 503 for

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
        elif path == "/health":
            entries = self.replicas.prefix_entries()
            await send_json(send, 200, b'{"status": "ok", "prefix_index_entries": %d}' % entries)
        elif wire is not None or path == "/v1/models":
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
        data = [
            {"id": r.name, "object": "model", "created": r.created_s, "owned_by": r.tenant}
            for r in self.registry.routes()
            if visible(r, tenant)
        ]
        await send_json(send, 200, json.dumps({"object": "list", "data": data}).encode())

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
        for _ in range(MAX_REPLICA_TRIES):
            load = await self._replica_for(request, route, send)
            if load is None:
                return  # answered already (held too long, too many held, model gone, failing)
            if await self._forward_counted(load, request, path, body, stream, send, watch):
                return
            # The replica could not be reached (nothing was sent to the client yet): another one, or, with none
            # left to try, a moment's wait for the registry to change (a replica that died is being replaced).
            load.unreachable_until_s = loop.time() + UNREACHABLE_BACKOFF_S
            if not any(other.view(loop.time()).accepting for other in self.replicas.loads(request.model)):
                await self._pause(request)
        message = f"no replica of model {request.model!r} could be reached"
        await send_json(send, 502, error_body(message, "api_error", "replica_unreachable"))
        if self.metrics is not None:
            now = loop.time()
            self.metrics.answered(request.model, request.slo.name.lower(), 502, request.arrival_s, now, None, now, 0)

    async def _pause(self, request: InferenceRequest) -> None:
        """Wait until the model's replicas change, ``UNREACHABLE_BACKOFF_S`` at most."""
        with contextlib.suppress(TimeoutError, HoldOverflow, HoldExpired):
            await asyncio.wait_for(self.hold.wait(request), UNREACHABLE_BACKOFF_S)

    async def _replica_for(self, request: InferenceRequest, route: ModelRoute, send: Send) -> ReplicaLoad | None:
        """The replica the router picks, holding the request while the model has none ready; None once the
        request has been answered (429, 504 or 404)."""
        loop = asyncio.get_running_loop()
        picked_at = time.perf_counter()
        load = self.replicas.pick(request, route.router, loop.time())
        if self.metrics is not None:
            self.metrics.decision.observe(time.perf_counter() - picked_at)
        while load is None:
            if route.failing:
                await _failing(send, route)
                return None
            if self.config.on_demand is not None:
                self.config.on_demand(request.model)
            try:
                await self.hold.wait(request)
            except HoldOverflow as exc:
                retry = [(b"retry-after", str(self.config.retry_after_s).encode())]
                await send_json(send, 429, error_body(str(exc), "rate_limit_error", "model_starting"), retry)
                return None
            except HoldExpired as exc:
                await send_json(send, 504, error_body(str(exc), "timeout_error", "model_not_ready"))
                return None
            current = self.registry.route(request.model)
            if current is None:
                await _not_found(send, request.model)
                return None
            route = current
            load = self.replicas.pick(request, current.router, loop.time())
        return load

    async def _forward_counted(
        self, load: ReplicaLoad, request: InferenceRequest, path: str, body: bytes, stream: bool, send: Send,
        watch: DisconnectWatch,
    ) -> bool:  # fmt: skip
        """Forward to ``load``'s replica, counted in its in-flight load; False when it could not be reached."""
        loop = asyncio.get_running_loop()
        prompt, work = request.prompt_tokens, request.prompt_tokens + request.output_tokens
        load.inflight += 1
        load.inflight_tokens += work
        load.inflight_prompt_tokens += prompt
        metrics = self.metrics
        if metrics is not None:
            sent_s, answer = loop.time(), _AnswerWatch(send, loop)
            send = answer.send
        reached = True  # an attempt that reached no replica is not an answer: another replica gets the request
        try:
            reached = await forward(self.upstream, load, path, body, stream, send, watch)
            return reached
        finally:
            load.inflight -= 1
            load.inflight_tokens -= work
            load.inflight_prompt_tokens -= prompt
            if metrics is not None and reached:
                metrics.answered(
                    request.model, request.slo.name.lower(), answer.status, request.arrival_s, sent_s, answer.first_s,
                    loop.time(), answer.chunks,
                )  # fmt: skip


class _AnswerWatch:
    """Passes an answer on to the client, noting its status, when its first bytes went and how many chunks."""

    __slots__ = ("_send", "_loop", "status", "first_s", "chunks")

    def __init__(self, send: Send, loop: asyncio.AbstractEventLoop) -> None:
        self._send, self._loop = send, loop
        self.status, self.chunks = 0, 0
        self.first_s: float | None = None

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
        elif message.get("body"):
            self.chunks += 1
            if self.first_s is None:
                self.first_s = self._loop.time()
        await self._send(message)


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


async def _failing(send: Send, route: ModelRoute) -> None:
    message = f"model {route.name!r} is failing: its replicas keep ending on their own ({route.failing})"
    retry = [(b"retry-after", str(max(1, route.retry_after_s)).encode())]
    await send_json(send, 503, error_body(message, "api_error", "model_failing"), retry)


async def _not_found(send: Send, model: str) -> None:
    message = f"The model `{model}` does not exist or you do not have access to it."
    await send_json(send, 404, error_body(message, "invalid_request_error", "model_not_found", "model"))
