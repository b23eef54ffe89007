"""An HTTP server on 127.0.0.1 that answers like SGLang's OpenAI-compatible server, from the files in
``sglang_recorded/`` (SGLang's response, stream and metrics formats for one small chat model, ``smollm2``).

SGLang cannot run on this project's CPU-only CI (no CPU build on PyPI), so the SGLang adapter and the gateway in
front of it are tested against these answers instead. It serves ``/health``, ``/metrics``, ``/v1/models``,
``/v1/chat/completions`` (streamed as SSE in chunked transfer encoding, or whole) and SGLang's sleep endpoints
(``/release_memory_occupation``, ``/resume_memory_occupation``: 200 with a JSON ``null``, as SGLang answers), and
keeps what it was asked (``calls``: method, path, body) for the tests to check.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

RECORDED = Path(__file__).parent / "sglang_recorded"
MODEL = "smollm2"


class SGLangReplay:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str, bytes]] = []
        self.released = False
        self._server: asyncio.Server | None = None
        self.port = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

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
        if method == "GET" and path == "/health":
            self._send(writer, 200, b"", "text/plain")
        elif method == "GET" and path == "/metrics":
            self._send(writer, 200, (RECORDED / "metrics.prom").read_bytes(), "text/plain; version=0.0.4")
        elif method == "GET" and path == "/v1/models":
            self._send(writer, 200, (RECORDED / "models.json").read_bytes())
        elif method == "POST" and path in ("/release_memory_occupation", "/resume_memory_occupation"):
            self.released = path == "/release_memory_occupation"
            self._send(writer, 200, b"null")
        elif method == "POST" and path == "/v1/chat/completions":
            request = json.loads(body)
            if request.get("model") != MODEL:
                error = {"object": "error", "message": f"The model `{request.get('model')}` does not exist.",
                         "type": "NotFoundError", "param": None, "code": 404}  # fmt: skip
                self._send(writer, 404, json.dumps(error).encode())
            elif request.get("stream"):
                await self._stream(writer, (RECORDED / "chat_stream.sse").read_bytes())
            else:
                self._send(writer, 200, (RECORDED / "chat.json").read_bytes())
        else:
            self._send(writer, 404, b'{"detail":"Not Found"}')
        await writer.drain()

    @staticmethod
    def _send(writer: asyncio.StreamWriter, status: int, body: bytes, kind: str = "application/json") -> None:
        head = f"HTTP/1.1 {status} X\r\ncontent-type: {kind}\r\ncontent-length: {len(body)}\r\n\r\n"
        writer.write(head.encode("latin-1") + body)

    @staticmethod
    async def _stream(writer: asyncio.StreamWriter, events: bytes) -> None:
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\ntransfer-encoding: chunked\r\n\r\n"
        )
        for event in events.split(b"\n\n"):
            if event:
                frame = event + b"\n\n"
                writer.write(b"%x\r\n%s\r\n" % (len(frame), frame))
                await writer.drain()
                await asyncio.sleep(0.001)  # one event per write, as an engine streaming tokens
        writer.write(b"0\r\n\r\n")
