"""``GET /v1/events/stream``: Server-Sent Events that tell a client (the dashboard) *that* something changed, so it
re-fetches what it shows instead of polling every route.

The route polls the store's events table every ``POLL_S`` (one indexed ``max(id)`` query) and sends
``event: changed`` with ``{"last_event_id": N}`` when the newest event the caller may see changed (at once on
connecting, then on each change). It is scoped like every ``/v1`` route: a tenant's stream counts only events of its
own workloads. It carries no data of its own: the client reads the other routes for that.

Bounded per connection: it ends after ``max_seconds`` (default ``DEFAULT_LIFETIME_S``; the client reconnects) or
``max_events`` changes, sends a comment every ``HEARTBEAT_S`` while nothing changes (so a vanished client is noticed
when the write fails), and stops when the client disconnects or the server begins to shut down (uvicorn waits for
open responses: a stream would hold the shutdown). At most ``MAX_STREAMS`` streams are open at once per server, and
at most ``MAX_STREAMS_PER_TENANT`` per tenant (the admin counts as one more tenant): 429 beyond, so that one tenant
holding streams cannot lock out the others. A stream's slot is taken when the request is accepted (not when its
body starts, which a burst of requests would race) and given back when the stream ends, or when its body is dropped
without ever starting. The token is read from the ``Authorization`` header, as everywhere else: the dashboard reads
the stream with ``fetch``, which can send it (``EventSource`` cannot).
"""

from __future__ import annotations

import asyncio
import json
import time
import weakref
from collections.abc import AsyncIterator, Callable
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query, Request, status
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from tessera.api import ErrorOut
from tessera.server.api.routes import Caller
from tessera.server.context import ServerContext
from tessera.server.store import feed

POLL_S = 0.5
HEARTBEAT_S = 15.0
DEFAULT_LIFETIME_S = 300
MAX_STREAMS = 64
MAX_STREAMS_PER_TENANT = 8
ADMIN_KEY = "(admin)"  # the admin's streams are counted apart from every tenant's

STREAM_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "description": 'Server-Sent Events: `event: changed` with `data: {"last_event_id": N}`; `:` comments keep it '
        "alive",
        "content": {"text/event-stream": {"schema": {"type": "string"}}},
    },
    429: {"model": ErrorOut, "description": "too many open streams on this server, or of this tenant"},
}


def router(ctx: ServerContext) -> APIRouter:
    api = APIRouter(tags=["events"])

    @api.get("/events/stream", response_class=StreamingResponse, responses=STREAM_RESPONSES)
    async def event_stream(
        request: Request,
        caller: Caller,
        max_seconds: Annotated[int, Query(ge=1, le=3600, description="end the stream after this long")] = (
            DEFAULT_LIFETIME_S
        ),
        max_events: Annotated[int | None, Query(ge=1, le=1_000_000, description="end after this many")] = None,
    ) -> StreamingResponse:
        """Tells the caller when something it may see changed (``changed`` events), so it re-fetches; see the
        module's docstring for the bounds."""
        app = request.app
        tenant = None if caller.is_admin else caller.tenant
        release = take_stream_slot(app, ADMIN_KEY if tenant is None else tenant)

        async def changes() -> AsyncIterator[str]:
            try:
                deadline = time.monotonic() + max_seconds
                last, sent, quiet_since = -1, 0, time.monotonic()
                yield f"retry: {int(POLL_S * 4000)}\n\n"  # how long an EventSource client waits before reconnecting
                while time.monotonic() < deadline and not ctx.closing() and not await request.is_disconnected():
                    latest = await run_in_threadpool(feed.latest_event_id, ctx.store, tenant)
                    if latest != last:
                        last, sent, quiet_since = latest, sent + 1, time.monotonic()
                        yield f"id: {latest}\nevent: changed\ndata: {json.dumps({'last_event_id': latest})}\n\n"
                        if max_events is not None and sent >= max_events:
                            return
                    elif time.monotonic() - quiet_since >= HEARTBEAT_S:
                        quiet_since = time.monotonic()
                        yield ": keep-alive\n\n"
                    await asyncio.sleep(POLL_S)
            finally:
                release()

        body = changes()
        weakref.finalize(body, release)  # a body dropped before it started never runs its ``finally``
        headers = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
        return StreamingResponse(body, media_type="text/event-stream", headers=headers)

    return api


def open_streams(app: Any) -> int:
    """The streams open now on ``app`` (changed only on the event loop's thread: no lock)."""
    return int(getattr(app.state, "event_streams", 0))


def take_stream_slot(app: Any, who: str) -> Callable[[], None]:
    """Count one more open stream of ``who`` (a tenant, or ``ADMIN_KEY``) on ``app``; returns the function that gives
    it back (once, however often it is called). ``HTTPException`` 429 when the server or ``who`` is at its limit.
    Called on the event loop's thread only (no lock)."""
    per_caller: dict[str, int] | None = getattr(app.state, "event_streams_of", None)
    if per_caller is None:
        per_caller = app.state.event_streams_of = {}
    if open_streams(app) >= MAX_STREAMS:
        raise HTTPException(status.HTTP_429_TOO_MANY_REQUESTS, detail=f"over {MAX_STREAMS} open event streams")
    if per_caller.get(who, 0) >= MAX_STREAMS_PER_TENANT:
        whose = "the admin's" if who == ADMIN_KEY else f"tenant {who}'s"
        detail = f"{whose} {MAX_STREAMS_PER_TENANT} open event streams are its limit: close one first"
        raise HTTPException(status.HTTP_429_TOO_MANY_REQUESTS, detail=detail)
    app.state.event_streams = open_streams(app) + 1
    per_caller[who] = per_caller.get(who, 0) + 1
    held = [True]

    def release() -> None:
        if held.pop() if held else False:
            app.state.event_streams -= 1
            per_caller[who] -= 1
            if not per_caller[who]:
                del per_caller[who]

    return release
