"""Forwarding one request to a replica and passing its answer back as it comes (SSE chunks are not buffered).

The client's own body goes upstream unchanged. ``DisconnectWatch`` listens for the client going away and cancels
the request's task: a request held for a replica leaves the hold queue, and one in flight closes its upstream
connection, which makes the engine abort it (vLLM and the sim both do on a dropped connection).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from typing import Any

from tessera.serving.engines.openai_wire import error_body
from tessera.serving.gateway.replicas import ReplicaLoad
from tessera.serving.gateway.upstream import Upstream, UpstreamError, UpstreamResponse

log = logging.getLogger(__name__)
Message = MutableMapping[str, Any]
Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
Headers = list[tuple[bytes, bytes]]


class DisconnectWatch:
    """Cancels ``task`` when the client disconnects before ``finishing`` (or ``close``) is called.

    Once the answer's end has been sent, ASGI's ``receive`` returns ``http.disconnect`` by itself (uvicorn wakes
    it as the response completes), so ``close`` after ``finishing`` lets the watcher end on its own rather than
    cancelling it: a cancelled task leaves a reference cycle behind (its ``CancelledError``'s traceback holds the
    frames that hold the task), about 25 objects per request that only the cyclic garbage collector frees, and
    at 1,000 requests/s those collections stalled the event loop for tens of milliseconds (the p99 tail)."""

    __slots__ = ("disconnected", "_done", "_watcher")

    def __init__(self, receive: Receive, task: asyncio.Task[Any]) -> None:
        self.disconnected = False
        self._done = False
        self._watcher = asyncio.ensure_future(self._run(receive, task))

    async def _run(self, receive: Receive, task: asyncio.Task[Any]) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                if not self._done:
                    self.disconnected = True
                    task.cancel()
                return

    def finishing(self) -> None:
        """The answer is complete: the end of the connection is no disconnect any more."""
        self._done = True

    def close(self) -> None:
        if not self._done:  # no complete answer was sent: the watcher's receive may never return
            self._done = True
            self._watcher.cancel()


async def send_json(send: Send, status: int, body: bytes, headers: Headers | None = None) -> None:
    head: Headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": head + (headers or [])})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def forward(
    upstream: Upstream,
    load: ReplicaLoad,
    path: str,
    body: bytes,
    stream: bool,
    send: Send,
    watch: DisconnectWatch,
) -> bool:
    """POST ``body`` to the replica's ``path`` and relay the answer (status, type, bytes as they arrive). False
    when the replica was gone before the first byte of its answer (refused, reset, closed: nothing was sent to the
    client, and the caller may send the request elsewhere). The answer's head goes to the client with its first
    body bytes, not before: until then a replica that dies leaves the client untouched."""
    try:
        endpoint = load.endpoint
        response = await upstream.post(endpoint.base_url, path, body, endpoint.peer_pid, endpoint.api_key)
    except UpstreamError as exc:
        log.warning("replica %s unreachable: %s", load.endpoint.base_url, exc)
        return False
    try:
        pieces = aiter(response.chunks())
        try:
            first = await anext(pieces, b"")
        except UpstreamError as exc:
            log.warning("replica %s gone before its answer's first byte: %s", load.endpoint.base_url, exc)
            return False
        headers: Headers = [
            (b"content-type", response.content_type.encode("latin-1")),
            (b"x-tessera-replica", str(load.endpoint.replica).encode()),
        ]
        if response.content_length is not None:
            headers.append((b"content-length", str(response.content_length).encode()))
        else:
            headers.append((b"cache-control", b"no-cache"))
        await send({"type": "http.response.start", "status": response.status, "headers": headers})
        await _relay(response, first, pieces, stream, send, watch, load)
        return True
    finally:
        if response.closes_at_once:
            await response.close()
        else:
            await asyncio.shield(response.close())


async def _relay(
    response: UpstreamResponse, first: bytes, pieces: AsyncIterator[bytes], stream: bool, send: Send,
    watch: DisconnectWatch, load: ReplicaLoad,
) -> None:  # fmt: skip
    """The answer's body, from its ``first`` piece on (the head is sent); a replica that fails now ends it."""
    ended = response.complete
    if ended:  # the whole body came at once: it and the answer's end go in one write
        watch.finishing()
    await send({"type": "http.response.body", "body": first, "more_body": not ended})
    if ended:
        return
    try:
        async for chunk in pieces:
            if response.complete:  # the last piece: it and the answer's end go in one write
                watch.finishing()
                ended = True
            await send({"type": "http.response.body", "body": chunk, "more_body": not ended})
    except UpstreamError as exc:  # the replica died or stalled mid-answer: end the answer cleanly, saying so
        watch.finishing()
        log.warning("replica %s failed mid-answer: %s", load.endpoint.base_url, exc)
        tail = b""
        if stream:
            message = f"the replica failed mid-answer: {exc}"
            tail = b"data: " + error_body(message, "api_error", "replica_failed") + b"\n\n"
        await send({"type": "http.response.body", "body": tail, "more_body": False})
        return
    if not ended:
        watch.finishing()
        await send({"type": "http.response.body", "body": b"", "more_body": False})
