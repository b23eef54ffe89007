"""A tiny HTTP server on 127.0.0.1 that answers each ``(method, path)`` with a canned response, and keeps what it was
asked (``calls``: method, path with its query, body), for the engine adapters' tests (vLLM's and ``transformers
serve``'s answers, recorded from the real servers where they run here). A path it has no answer for gets 404 with
FastAPI's body, as both servers answer."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar


@dataclass
class Canned:
    status: int = 200
    body: bytes = b""
    content_type: str = "application/json"


Answer = Canned | Callable[[bytes], Canned]


class FakeEngine:
    def __init__(self, answers: dict[tuple[str, str], Answer]) -> None:
        self.answers = answers
        self.calls: list[tuple[str, str, bytes]] = []
        self._server: asyncio.Server | None = None
        self.port = 0

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                length = 0
                for line in lines[1:]:
                    name, _, value = line.partition(":")
                    if name.strip().lower() == "content-length":
                        length = int(value)
                body = await reader.readexactly(length) if length else b""
                self.calls.append((method, path, body))
                await self._answer(method, path, body, writer)
        finally:
            writer.close()

    async def _answer(self, method: str, path: str, body: bytes, writer: asyncio.StreamWriter) -> None:
        """The canned answer to ``(method, path)`` (404 with FastAPI's body when there is none); a subclass that
        answers by its own rules (``sglang_replay``) overrides this and keeps the server."""
        answer = self.answers.get((method, path), Canned(404, b'{"detail":"Not Found"}'))
        canned = answer(body) if callable(answer) else answer
        kind, length = canned.content_type, len(canned.body)
        head = f"HTTP/1.1 {canned.status} X\r\ncontent-type: {kind}\r\ncontent-length: {length}\r\n\r\n"
        writer.write(head.encode() + canned.body)
        await writer.drain()


Served = TypeVar("Served", bound=FakeEngine)


def serving_on_own_loop(server: Served) -> Iterator[tuple[asyncio.AbstractEventLoop, Served]]:
    """A fixture's body: ``server`` started on a new event loop, yielded with it, then stopped and the loop closed."""
    loop = asyncio.new_event_loop()
    loop.run_until_complete(server.start())
    try:
        yield loop, server
    finally:
        loop.run_until_complete(server.stop())
        loop.close()
