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

from engine_fake import FakeEngine

RECORDED = Path(__file__).parent / "sglang_recorded"
MODEL = "smollm2"


class SGLangReplay(FakeEngine):
    """``FakeEngine``'s server, answering by SGLang's rules instead of a table."""

    def __init__(self) -> None:
        super().__init__({})
        self.released = False

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

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
