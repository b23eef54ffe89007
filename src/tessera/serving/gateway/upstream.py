"""The gateway's client towards the replicas: one seam (``Upstream``), two implementations.

A replica's address is ``http://HOST:PORT`` or ``unix:PATH``: a replica of ``tessera up`` on the local backend
listens on a Unix socket in its private runtime directory (``serving.engine_exec``), which only the server can
reach. A request may name the process that must be listening (``peer_pid``, the one the gateway proved to be the
replica when it registered it): a new connection to a Unix socket whose listener is another process is refused
(``SO_PEERCRED``), so nothing but the replica ever receives a request meant for it. A replica on a TCP port of
another node (the Ray backend) requires its own key instead: a request may carry it (``api_key``), sent as
``Authorization: Bearer``. Nothing of the client's request but its body goes upstream: the head is made here, so a
client's own ``Authorization`` (its Tessera token) never reaches a replica.

- ``RawUpstream`` (the default): HTTP/1.1 over asyncio streams with a keep-alive pool per replica. It exists
  because httpx's pool (httpcore) checks every pooled connection on every request (``is_idle``,
  ``has_expired``, a readability poll of each socket): with the few hundred connections that 1,000 streaming
  requests/s keep open, that was most of the gateway's time and capped it near 100 requests/s on this machine.
  Here a request takes an idle connection in O(1), and a streamed body is read as it comes (whatever the socket
  holds, chunk frames decoded in one pass) and handed on at once.
  Idle connections are closed when the replica closed its end (no ``CLOSE_WAIT`` left behind), after
  ``idle_timeout_s``, and when the replica leaves the registry (``forget``); at most ``max_idle_total`` are kept.
  A streamed answer that sends nothing for ``chunk_gap_s`` once it has begun (a stalled engine) ends with
  ``UpstreamError``; its first bytes may take ``timeout_s``, as its head may.
- ``HttpxUpstream`` (``upstream_httpx``): the same over an ``httpx.AsyncClient`` (tests drive the gateway through
  httpx's mock transport with it).

``UpstreamResponse.close`` before the body's end drops the connection: that is how a client's disconnect reaches
the engine (vLLM and the sim abort a request whose connection closes).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import socket
import struct
from collections.abc import AsyncIterator
from typing import Protocol
from urllib.parse import urlsplit

from tessera.serving.gateway.deadlines import Deadlines

READ_BYTES = 65536
MAX_HEAD_BYTES = 64 * 1024
MAX_CALL_BODY_BYTES = 16 * 1024 * 1024  # an answer read whole (``call``: metrics, health)
UNIX_SCHEME = "unix:"


class UpstreamError(ConnectionError):
    """The replica could not be reached, or broke its answer off."""


class UpstreamResponse(Protocol):
    status: int
    content_type: str
    content_length: int | None

    # True when ``close`` never suspends (no await inside): it then runs to its end even while the task is being
    # cancelled, with no ``asyncio.shield`` (a task of its own per request) around it.
    closes_at_once: bool

    # True once the body's end has been read: set before ``chunks`` yields the last piece, so the caller can send
    # that piece and the end of its own answer in one write.
    complete: bool

    def chunks(self) -> AsyncIterator[bytes]: ...

    async def close(self) -> None: ...


class Upstream(Protocol):
    async def post(
        self, base_url: str, path: str, body: bytes, peer_pid: int | None = None, api_key: str | None = None
    ) -> UpstreamResponse:
        """Send the request and return once the response's status and headers are in (``UpstreamError``)."""
        ...

    async def call(
        self,
        method: str,
        base_url: str,
        path: str,
        body: bytes = b"",
        peer_pid: int | None = None,
        api_key: str | None = None,
    ) -> tuple[int, bytes]:
        """A small exchange read whole (metrics, health, wake-up): the status and the body (``UpstreamError``)."""
        ...

    def forget(self, base_url: str) -> None:
        """The replica at ``base_url`` is gone: drop its idle connections."""
        ...

    async def aclose(self) -> None: ...


# -------------------------------------------------------------------------------------------------- raw asyncio
_Conn = tuple[asyncio.StreamReader, asyncio.StreamWriter]
_Key = tuple[str, int]  # (host, port), or (the socket's path, 0)


class _RawResponse:
    closes_at_once = True

    def __init__(
        self, pool: RawUpstream, key: _Key, conn: _Conn, head: bytes, rest: bytes, listener: int | None = None
    ) -> None:
        self._pool, self._key, self._conn = pool, key, conn
        self._listener = listener  # the process listening at a Unix socket, as checked when it was connected
        lines = head.decode("latin-1").split("\r\n")
        self.status = int(lines[0].split(" ", 2)[1])
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        self.content_type = headers.get("content-type", "application/json")
        length = headers.get("content-length")
        self.content_length = int(length) if length is not None else None
        self._chunked = headers.get("transfer-encoding", "").lower() == "chunked"
        self._reusable = headers.get("connection", "").lower() != "close"
        self._buffer = bytearray(rest)
        self._begun = bool(rest)  # some of the body has come
        self.complete = False

    def chunks(self) -> AsyncIterator[bytes]:
        return self._chunked_body() if self._chunked else self._sized_body()

    async def _read_some(self) -> bytes:
        """What the socket holds next, waiting at most the pool's ``chunk_gap_s`` (a stalled replica) once the body
        has begun; before, its ``timeout_s`` (an engine may queue a request a long while before its first token)."""
        gap = self._pool.chunk_gap_s if self._begun else self._pool.timeout_s
        try:
            data = await self._pool._deadlines.within(self._conn[0].read(READ_BYTES), gap)
        except TimeoutError:
            raise UpstreamError(f"no data from the replica for {gap:g} s") from None
        self._begun = True
        return data

    async def _read(self) -> bytes:
        data = await self._read_some()
        if not data:
            raise UpstreamError("the replica closed the connection mid-answer")
        return data

    async def _sized_body(self) -> AsyncIterator[bytes]:
        left = self.content_length
        if left is None:  # no length, not chunked: the body ends with the connection
            self._reusable = False
            if self._buffer:
                yield bytes(self._buffer)
            while data := await self._read_some():
                yield data
            self.complete = True
            return
        if self._buffer:
            left -= len(self._buffer)
            self.complete = left <= 0
            yield bytes(self._buffer)
            self._buffer.clear()
        while left > 0:
            data = await self._read()
            left -= len(data)
            self.complete = left <= 0
            yield data
        self.complete = True

    async def _chunked_body(self) -> AsyncIterator[bytes]:
        buffer = self._buffer
        while True:
            out: list[bytes] = []
            done = False
            while True:  # every complete chunk frame in the buffer
                eol = buffer.find(b"\r\n")
                if eol < 0:
                    break
                try:
                    size = int(bytes(buffer[:eol]).split(b";", 1)[0], 16)
                except ValueError:
                    raise UpstreamError("the replica sent a malformed chunk") from None
                if size == 0:
                    if len(buffer) < eol + 4:  # the last frame's closing CRLF (no trailers sent here)
                        break
                    del buffer[: eol + 4]
                    done = True
                    break
                if len(buffer) < eol + 2 + size + 2:
                    break
                out.append(bytes(buffer[eol + 2 : eol + 2 + size]))
                del buffer[: eol + 2 + size + 2]
            if done:
                self.complete = True
            if out:
                yield b"".join(out)
            if done:
                return
            buffer += await self._read()

    async def close(self) -> None:
        if self.complete and self._reusable and not self._buffer:
            self._pool._give_back(self._key, self._conn, self._listener)
        else:
            self._conn[1].close()


@functools.lru_cache(maxsize=4096)  # replicas come and go: bounded
def _key_of(base_url: str) -> _Key:
    """A replica's key: (host, port), or (the socket's path, 0) for ``unix:PATH``."""
    if base_url.startswith(UNIX_SCHEME):
        return base_url[len(UNIX_SCHEME) :], 0
    parts = urlsplit(base_url)
    return parts.hostname or "127.0.0.1", parts.port or 80


def _where(key: _Key) -> str:
    return key[0] if key[1] == 0 else f"{key[0]}:{key[1]}"


@functools.lru_cache(maxsize=4096)
def _request_head(method: str, base_url: str, path: str, api_key: str | None = None) -> tuple[_Key, bytes]:
    """The replica's key and the request head up to the length, parsed once per method, URL, path and API key."""
    key = _key_of(base_url)
    host_header = "localhost" if key[1] == 0 else f"{key[0]}:{key[1]}"
    head = f"{method} {path} HTTP/1.1\r\nhost: {host_header}\r\n"
    if api_key is not None:
        head += f"authorization: Bearer {api_key}\r\n"
    head += "content-type: application/json\r\ncontent-length: "
    return key, head.encode("latin-1")


def peer_pid_of(sock: socket.socket) -> int | None:
    """The process listening at the other end of a connected Unix socket (``SO_PEERCRED``), None for TCP."""
    if sock.family != socket.AF_UNIX:
        return None
    pid: int = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))[0]
    return pid


class RawUpstream:
    """See the module docstring."""

    def __init__(
        self,
        timeout_s: float = 600.0,
        max_idle_per_replica: int = 1024,
        *,
        chunk_gap_s: float = 300.0,
        idle_timeout_s: float = 30.0,
        max_idle_total: int = 8192,
    ) -> None:
        self.timeout_s = timeout_s
        self.max_idle_per_replica = max_idle_per_replica
        self.chunk_gap_s = chunk_gap_s
        self.idle_timeout_s = idle_timeout_s
        self.max_idle_total = max_idle_total
        # Each replica's kept-alive connections, newest last: (connection, idle since, the pid listening at a socket)
        self._idle: dict[_Key, list[tuple[_Conn, float, int | None]]] = {}
        self._idle_count = 0
        self._sweep_timer: asyncio.TimerHandle | None = None
        self._deadlines = Deadlines(min(1.0, max(0.01, min(timeout_s, chunk_gap_s) / 10)))

    async def post(
        self, base_url: str, path: str, body: bytes, peer_pid: int | None = None, api_key: str | None = None
    ) -> UpstreamResponse:
        return await self._send("POST", base_url, path, body, peer_pid, api_key)

    async def call(
        self,
        method: str,
        base_url: str,
        path: str,
        body: bytes = b"",
        peer_pid: int | None = None,
        api_key: str | None = None,
    ) -> tuple[int, bytes]:
        response = await self._send(method, base_url, path, body, peer_pid, api_key)
        try:
            data = bytearray()
            async for chunk in response.chunks():
                data += chunk
                if len(data) > MAX_CALL_BODY_BYTES:
                    raise UpstreamError(f"the answer to {method} {path} is over {MAX_CALL_BODY_BYTES} bytes")
            return response.status, bytes(data)
        finally:
            await response.close()

    async def _send(
        self, method: str, base_url: str, path: str, body: bytes, peer_pid: int | None, api_key: str | None
    ) -> _RawResponse:
        key, head = _request_head(method, base_url, path, api_key)
        payload = b"%b%d\r\n\r\n%b" % (head, len(body), body)
        idle = self._idle.get(key)
        while idle:  # a kept-alive connection the replica may have closed meanwhile: one fresh retry then
            conn, _, listener = idle.pop()
            self._idle_count -= 1
            if conn[0].at_eof() or conn[1].is_closing() or (peer_pid is not None and listener != peer_pid):
                conn[1].close()
                continue
            with contextlib.suppress(UpstreamError):
                return await self._exchange(key, conn, payload, listener)
            break
        conn, listener = await self._connect(key, peer_pid)
        return await self._exchange(key, conn, payload, listener)

    async def _connect(self, key: _Key, peer_pid: int | None) -> tuple[_Conn, int | None]:
        """A new connection, and the process listening at a Unix socket (refused unless it is ``peer_pid``)."""
        try:
            async with asyncio.timeout(self.timeout_s):  # no task of its own, unlike wait_for before 3.12
                if key[1] == 0:
                    conn = await asyncio.open_unix_connection(key[0])
                else:
                    conn = await asyncio.open_connection(key[0], key[1])
        except (OSError, TimeoutError) as exc:
            raise UpstreamError(f"cannot connect to {_where(key)}: {exc}") from exc
        listener = peer_pid_of(conn[1].get_extra_info("socket")) if key[1] == 0 else None
        if peer_pid is not None and listener is not None and listener != peer_pid:
            conn[1].close()
            raise UpstreamError(f"{_where(key)} is served by process {listener}, not by the replica ({peer_pid})")
        return conn, listener

    async def _exchange(self, key: _Key, conn: _Conn, payload: bytes, listener: int | None) -> _RawResponse:
        reader, writer = conn
        try:
            writer.write(payload)
            head = await self._deadlines.within(reader.readuntil(b"\r\n\r\n"), self.timeout_s)
        except TimeoutError:
            writer.close()
            raise UpstreamError(f"no answer from {_where(key)} in {self.timeout_s} s") from None
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
            writer.close()
            raise UpstreamError(f"no answer from {_where(key)}: {type(exc).__name__}") from exc
        except BaseException:  # the client left: the replica must see the close
            writer.close()
            raise
        try:
            return _RawResponse(self, key, conn, head[:-4], b"", listener)
        except (ValueError, IndexError):
            writer.close()
            raise UpstreamError(f"{_where(key)} sent a malformed answer head") from None

    def _give_back(self, key: _Key, conn: _Conn, listener: int | None) -> None:
        idle = self._idle.setdefault(key, [])
        if len(idle) >= self.max_idle_per_replica or self._idle_count >= self.max_idle_total:
            conn[1].close()
            return
        loop = asyncio.get_running_loop()
        idle.append((conn, loop.time(), listener))
        self._idle_count += 1
        if self._sweep_timer is None:
            self._sweep_timer = loop.call_later(1.0, self._sweep, loop)

    def _sweep(self, loop: asyncio.AbstractEventLoop) -> None:
        """Close the idle connections that the replica closed (they would sit in CLOSE_WAIT) or that have been idle
        for ``idle_timeout_s``; again every second while any is kept."""
        self._sweep_timer = None
        oldest = loop.time() - self.idle_timeout_s
        for key in list(self._idle):
            kept = []
            for held in self._idle[key]:
                conn, since, _ = held
                if since < oldest or conn[0].at_eof() or conn[1].is_closing():
                    conn[1].close()
                else:
                    kept.append(held)
            self._idle_count -= len(self._idle[key]) - len(kept)
            if kept:
                self._idle[key] = kept
            else:
                del self._idle[key]
        if self._idle_count:
            self._sweep_timer = loop.call_later(1.0, self._sweep, loop)

    def idle_connections(self) -> int:
        return self._idle_count

    def forget(self, base_url: str) -> None:
        key = _key_of(base_url)
        for conn, _, _ in self._idle.pop(key, []):
            conn[1].close()
            self._idle_count -= 1

    async def aclose(self) -> None:
        for idle in self._idle.values():
            for (_, writer), _, _ in idle:
                writer.close()
        self._idle.clear()
        self._idle_count = 0
        if self._sweep_timer is not None:
            self._sweep_timer.cancel()
            self._sweep_timer = None
