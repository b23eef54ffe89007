"""A minimal HTTP/1.1 server on ``asyncio.Protocol``, for the sim engine.

Why not a framework: the gateway's overhead benchmark drives ~1,000 streaming requests/s through engines that share
two cores with the gateway and the load generator, so the engine must cost next to nothing per request and per
token. This serves exactly what the sim needs: requests with a ``Content-Length`` body (no chunked uploads),
keep-alive and pipelining (one request at a time per connection), plain responses with a length, and chunked
streaming responses written as the tokens come. A handler answers now or later through its ``HttpConnection``;
``on_close`` tells it the client went away (the sim cancels the request in its engine model).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

log = logging.getLogger(__name__)

MAX_HEAD_BYTES = 64 * 1024
MAX_BODY_BYTES = 64 * 1024 * 1024
_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed", 409: "Conflict"}
_REASONS |= {411: "Length Required", 413: "Payload Too Large", 431: "Request Header Fields Too Large"}
_REASONS |= {401: "Unauthorized", 500: "Internal Server Error", 503: "Service Unavailable"}


@dataclass(frozen=True, slots=True)
class HttpRequest:
    method: str
    path: str  # without the query string
    query: str
    headers: dict[str, str]  # names in lower case
    body: bytes


Handler = Callable[[HttpRequest, "HttpConnection"], None]


class HttpConnection(asyncio.Protocol):
    """One client connection: parses requests, hands each to the handler, writes its response."""

    def __init__(self, handler: Handler) -> None:
        self._handler = handler
        self._transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._busy = False  # a request is being answered; later ones wait in the buffer
        self._keep_alive = True
        self.closed = False
        self.on_close: Callable[[], None] | None = None  # set by a handler whose answer is still coming

    # ------------------------------------------------------------------------------------------ asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass asyncio's

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        if not self._busy:
            self._parse()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        callback, self.on_close = self.on_close, None
        if callback is not None:
            callback()

    # ------------------------------------------------------------------------------------------------ responses
    def respond(self, status: int, body: bytes, content_type: str = "application/json", headers: str = "") -> None:
        """A whole response (``headers``: extra ``Name: value\\r\\n`` lines)."""
        head = (
            f"HTTP/1.1 {status} {_REASONS.get(status, 'Status')}\r\ncontent-type: {content_type}\r\n"
            f"content-length: {len(body)}\r\n{headers}{'' if self._keep_alive else 'connection: close'}\r\n"
        )
        self._write(head.encode("latin-1") + (b"" if self._keep_alive else b"\r\n") + body)
        self._done()

    def start_stream(self, content_type: str = "text/event-stream") -> None:
        """Begin a chunked 200 response; then ``send_chunk`` as data comes and ``end_stream``."""
        self._write(
            b"HTTP/1.1 200 OK\r\ncontent-type: "
            + content_type.encode("latin-1")
            + b"\r\ncache-control: no-cache\r\ntransfer-encoding: chunked\r\n\r\n"
        )

    def send_chunk(self, data: bytes) -> None:
        self._write(b"%x\r\n%b\r\n" % (len(data), data))

    def end_stream(self) -> None:
        self._write(b"0\r\n\r\n")
        self._done()

    # ------------------------------------------------------------------------------------------------ internals
    def _write(self, data: bytes) -> None:
        if self._transport is not None and not self.closed:
            self._transport.write(data)

    def _done(self) -> None:
        self._busy = False
        self.on_close = None
        if not self._keep_alive:
            if self._transport is not None:
                self._transport.close()
            return
        if self._buffer:
            asyncio.get_running_loop().call_soon(self._parse)

    def _fail(self, status: int, message: str) -> None:
        self._keep_alive = False
        body = b'{"error": {"message": "%b", "type": "BadRequestError", "param": null, "code": %d}}' % (
            message.encode(),
            status,
        )
        self.respond(status, body)

    def _parse(self) -> None:
        if self._busy or self.closed:
            return
        buffer = self._buffer
        end = buffer.find(b"\r\n\r\n")
        if end < 0:
            if len(buffer) > MAX_HEAD_BYTES:
                self._fail(431, "request head too large")
            return
        lines = bytes(buffer[:end]).decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3:
            self._fail(400, "malformed request line")
            return
        method, target, version = parts
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        if "transfer-encoding" in headers:
            self._fail(411, "chunked request bodies are not supported: send a Content-Length")
            return
        try:
            length = int(headers.get("content-length", "0"))
        except ValueError:
            self._fail(400, "bad Content-Length")
            return
        if length < 0 or length > MAX_BODY_BYTES:
            self._fail(413, "request body too large")
            return
        if len(buffer) < end + 4 + length:
            return
        body = bytes(buffer[end + 4 : end + 4 + length])
        del buffer[: end + 4 + length]
        connection = headers.get("connection", "").lower()
        self._keep_alive = connection != "close" if version == "HTTP/1.1" else connection == "keep-alive"
        path, _, query = target.partition("?")
        self._busy = True
        try:
            self._handler(HttpRequest(method, path, query, headers, body), self)
        except Exception:  # a handler bug must not leave the client hanging
            log.exception("handler failed on %s %s", method, path)
            if self._busy:
                self._fail(500, "internal error")


async def serve(handler: Handler, host: str, port: int) -> asyncio.Server:
    """Listen on ``host:port`` (port 0: any free port; read it from the server's sockets)."""
    loop = asyncio.get_running_loop()
    return await loop.create_server(lambda: HttpConnection(handler), host, port, reuse_address=True, backlog=4096)


async def serve_unix(handler: Handler, path: str) -> asyncio.Server:
    """Listen on the Unix socket ``path`` (a stale socket file of an earlier run there is replaced)."""
    loop = asyncio.get_running_loop()
    return await loop.create_unix_server(lambda: HttpConnection(handler), path, backlog=4096)
