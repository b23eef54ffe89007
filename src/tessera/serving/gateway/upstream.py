"""The gateway's client towards the replicas: one seam (``Upstream``), two implementations.

- ``RawUpstream`` (the default): HTTP/1.1 over asyncio streams with a keep-alive pool per replica. It exists
  because httpx's pool (httpcore) checks every pooled connection on every request (``is_idle``,
  ``has_expired``, a readability poll of each socket): with the few hundred connections that 1,000 streaming
  requests/s keep open, that was most of the gateway's time and capped it near 100 requests/s on this machine.
  Here a request takes an idle connection in O(1), and a streamed body is read as it comes (whatever the socket
  holds, chunk frames decoded in one pass) and handed on at once.
- ``HttpxUpstream``: the same over an ``httpx.AsyncClient`` (tests drive the gateway through httpx's mock
  transport with it).

``UpstreamResponse.close`` before the body's end drops the connection: that is how a client's disconnect reaches
the engine (vLLM and the sim abort a request whose connection closes).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator
from typing import Protocol
from urllib.parse import urlsplit

import httpx

READ_BYTES = 65536
MAX_HEAD_BYTES = 64 * 1024


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
    async def post(self, base_url: str, path: str, body: bytes) -> UpstreamResponse:
        """Send the request and return once the response's status and headers are in (``UpstreamError``)."""
        ...

    async def aclose(self) -> None: ...


# -------------------------------------------------------------------------------------------------- raw asyncio
_Conn = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class _Deadlines:
    """Deadlines of many tasks on one recurring timer: a task still registered when a check finds it past its
    deadline is cancelled (checks every ``tick_s``, so up to that late). An ``asyncio.timeout`` per exchange arms
    and disarms a loop timer per request, about 3% of the gateway's CPU at 1,000 req/s; the first-answer timeout
    is minutes long, so a coarse check is enough."""

    def __init__(self, tick_s: float) -> None:
        self.tick_s = tick_s
        self._due: dict[asyncio.Task[object], float] = {}
        self._late: set[asyncio.Task[object]] = set()
        self._timer: asyncio.TimerHandle | None = None

    def add(self, task: asyncio.Task[object], due: float, loop: asyncio.AbstractEventLoop) -> None:
        self._due[task] = due
        if self._timer is None:
            self._timer = loop.call_later(self.tick_s, self._check, loop)

    def remove(self, task: asyncio.Task[object]) -> bool:
        """Unregister ``task``; True when it was cancelled for being late."""
        self._due.pop(task, None)
        if task in self._late:
            self._late.discard(task)
            return True
        return False

    def _check(self, loop: asyncio.AbstractEventLoop) -> None:
        self._timer = None
        now = loop.time()
        for task, due in list(self._due.items()):
            if due <= now:
                del self._due[task]
                self._late.add(task)
                task.cancel()
        if self._due:
            self._timer = loop.call_later(self.tick_s, self._check, loop)


class _RawResponse:
    closes_at_once = True

    def __init__(self, pool: RawUpstream, key: tuple[str, int], conn: _Conn, head: bytes, rest: bytes) -> None:
        self._pool, self._key, self._conn = pool, key, conn
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
        self.complete = False

    def chunks(self) -> AsyncIterator[bytes]:
        return self._chunked_body() if self._chunked else self._sized_body()

    async def _read(self) -> bytes:
        data = await self._conn[0].read(READ_BYTES)
        if not data:
            raise UpstreamError("the replica closed the connection mid-answer")
        return data

    async def _sized_body(self) -> AsyncIterator[bytes]:
        left = self.content_length
        if left is None:  # no length, not chunked: the body ends with the connection
            self._reusable = False
            if self._buffer:
                yield bytes(self._buffer)
            while data := await self._conn[0].read(READ_BYTES):
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
                size = int(bytes(buffer[:eol]).split(b";", 1)[0], 16)
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
            self._pool._give_back(self._key, self._conn)
        else:
            self._conn[1].close()


@functools.lru_cache(maxsize=4096)  # replicas come and go: bounded
def _request_head(base_url: str, path: str) -> tuple[tuple[str, int], bytes]:
    """The replica's (host, port) and the request head up to the length, parsed once per URL and path."""
    parts = urlsplit(base_url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    head = f"POST {path} HTTP/1.1\r\nhost: {host}:{port}\r\ncontent-type: application/json\r\ncontent-length: "
    return (host, port), head.encode("latin-1")


class RawUpstream:
    """See the module docstring."""

    def __init__(self, timeout_s: float = 600.0, max_idle_per_replica: int = 1024) -> None:
        self.timeout_s = timeout_s
        self.max_idle_per_replica = max_idle_per_replica
        self._idle: dict[tuple[str, int], list[_Conn]] = {}
        self._deadlines = _Deadlines(min(1.0, max(0.01, timeout_s / 10)))  # for the first answer

    async def post(self, base_url: str, path: str, body: bytes) -> UpstreamResponse:
        key, head = _request_head(base_url, path)
        host, port = key
        payload = b"%b%d\r\n\r\n%b" % (head, len(body), body)
        idle = self._idle.get(key)
        while idle:  # a kept-alive connection the replica may have closed meanwhile: one fresh retry then
            conn = idle.pop()
            if conn[0].at_eof() or conn[1].is_closing():
                conn[1].close()
                continue
            with contextlib.suppress(UpstreamError):
                return await self._exchange(key, conn, payload)
            break
        try:
            async with asyncio.timeout(self.timeout_s):  # no task of its own, unlike wait_for before 3.12
                conn = await asyncio.open_connection(host, port)
        except (OSError, TimeoutError) as exc:
            raise UpstreamError(f"cannot connect to {host}:{port}: {exc}") from exc
        return await self._exchange(key, conn, payload)

    async def _exchange(self, key: tuple[str, int], conn: _Conn, payload: bytes) -> _RawResponse:
        reader, writer = conn
        task = asyncio.current_task()
        assert task is not None
        loop = asyncio.get_running_loop()
        self._deadlines.add(task, loop.time() + self.timeout_s, loop)
        try:
            writer.write(payload)
            head = await reader.readuntil(b"\r\n\r\n")
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
            writer.close()
            raise UpstreamError(f"no answer from {key[0]}:{key[1]}: {type(exc).__name__}") from exc
        except asyncio.CancelledError:  # the client left, or the answer is late: the replica must see the close
            writer.close()
            if self._deadlines.remove(task) and task.uncancel() == 0:
                raise UpstreamError(f"no answer from {key[0]}:{key[1]} in {self.timeout_s} s") from None
            raise
        except BaseException:
            writer.close()
            raise
        finally:
            self._deadlines.remove(task)
        return _RawResponse(self, key, conn, head[:-4], b"")

    def _give_back(self, key: tuple[str, int], conn: _Conn) -> None:
        idle = self._idle.setdefault(key, [])
        if len(idle) < self.max_idle_per_replica:
            idle.append(conn)
        else:
            conn[1].close()

    async def aclose(self) -> None:
        for idle in self._idle.values():
            for _, writer in idle:
                writer.close()
        self._idle.clear()


# ------------------------------------------------------------------------------------------------------ httpx
class _HttpxResponse:
    closes_at_once = False
    complete = False  # its last piece is not known as such: the end goes in a write of its own

    def __init__(self, response: httpx.Response) -> None:
        self._response = response
        self.status = response.status_code
        self.content_type = response.headers.get("content-type", "application/json")
        length = response.headers.get("content-length")
        self.content_length = int(length) if length is not None else None

    async def chunks(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._response.aiter_raw():
                if chunk:
                    yield chunk
        except httpx.HTTPError as exc:
            raise UpstreamError(str(exc)) from exc

    async def close(self) -> None:
        await self._response.aclose()


class HttpxUpstream:
    def __init__(self, client: httpx.AsyncClient) -> None:
        self.client = client

    async def post(self, base_url: str, path: str, body: bytes) -> UpstreamResponse:
        request = self.client.build_request(
            "POST", base_url + path, content=body, headers={"content-type": "application/json"}
        )
        try:
            return _HttpxResponse(await self.client.send(request, stream=True))
        except httpx.HTTPError as exc:
            raise UpstreamError(f"{type(exc).__name__}: {exc}") from exc

    async def aclose(self) -> None:
        await self.client.aclose()
