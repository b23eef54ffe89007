"""Driving the sim engine's HTTP handler in-process: a fake transport, raw requests in, parsed responses out."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

from tessera.serving.engines.http_lite import HttpConnection
from tessera.serving.engines.sim_api import SimApi, SimSettings
from tessera.serving.engines.sim_live import LiveEngine
from tessera.serving.policies.engine_parts import EngineConfig


@dataclass(frozen=True)
class ConstantTimes:
    """Every iteration takes ``iteration_s``, whatever it holds."""

    iteration_s_: float = 0.01

    def iteration_s(self, prefill_tokens: int, decode_batch: int, kv_tokens: int) -> float:
        return self.iteration_s_

    def decode_affine(self, decode_batch: int) -> tuple[float, float]:
        return self.iteration_s_, 0.0


class FakeTransport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.data = bytearray()
        self.closed = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.data += data

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed


def make_api(iteration_s: float = 0.001, kv_blocks: int = 1000, model: str = "m", priority: bool = False) -> SimApi:
    """The sim's API on an engine model of ``kv_blocks``; ``priority``: as ``--scheduling-policy priority``."""
    live = LiveEngine(EngineConfig(kv_blocks=kv_blocks, priority=priority), ConstantTimes(iteration_s))
    return SimApi(SimSettings(model, max_model_len=4096, default_output_tokens=4), live)


def connect(api: SimApi) -> tuple[HttpConnection, FakeTransport]:
    conn = HttpConnection(api)
    transport = FakeTransport()
    conn.connection_made(transport)
    return conn, transport


def post(path: str, body: dict[str, Any] | bytes, extra: str = "") -> bytes:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return f"POST {path} HTTP/1.1\r\nhost: x\r\ncontent-length: {len(raw)}\r\n{extra}\r\n".encode() + raw


def get(path: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nhost: x\r\n\r\n".encode()


@dataclass
class Response:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)

    def events(self) -> list[str]:
        """The SSE ``data:`` payloads, in order."""
        return [line[6:] for line in self.body.decode().split("\n") if line.startswith("data: ")]


def parse_responses(data: bytes) -> tuple[list[Response], bytes]:
    """The complete responses at the start of ``data`` (chunked bodies decoded), and what is left over."""
    out: list[Response] = []
    while True:
        end = data.find(b"\r\n\r\n")
        if end < 0:
            return out, data
        lines = data[:end].decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ")[1])
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        rest = data[end + 4 :]
        if headers.get("transfer-encoding") == "chunked":
            body = b""
            while True:
                eol = rest.find(b"\r\n")
                if eol < 0:
                    return out, data
                size = int(rest[:eol], 16)
                if len(rest) < eol + 2 + size + 2:
                    return out, data
                body += rest[eol + 2 : eol + 2 + size]
                rest = rest[eol + 2 + size + 2 :]
                if size == 0:
                    break
        else:
            length = int(headers.get("content-length", "0"))
            if len(rest) < length:
                return out, data
            body, rest = rest[:length], rest[length:]
        out.append(Response(status, headers, body))
        data = rest


async def exchange(api: SimApi, *requests: bytes, timeout_s: float = 5.0) -> list[Response]:
    """Send ``requests`` on one connection (pipelined) and wait for as many responses."""
    conn, transport = connect(api)
    conn.data_received(b"".join(requests))
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while loop.time() < deadline:
        responses, _ = parse_responses(bytes(transport.data))
        if len(responses) >= len(requests):
            return responses
        await asyncio.sleep(0.001)
    raise AssertionError(f"no full answer in {timeout_s} s: {bytes(transport.data)[:300]!r}")
