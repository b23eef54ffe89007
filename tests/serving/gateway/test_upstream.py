"""RawUpstream's response reading without a socket: a StreamReader fed by hand, the bytes split anywhere."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tessera.serving.gateway.upstream import RawUpstream, UpstreamError, _RawResponse


class FakeWriter:
    def __init__(self) -> None:
        self.closed = False

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed


def chunked(pieces: list[bytes]) -> bytes:
    return b"".join(b"%x\r\n%b\r\n" % (len(p), p) for p in pieces if p) + b"0\r\n\r\n"


async def read_all(head: bytes, wire: bytes, cuts: list[int], eof: bool = False) -> tuple[bytes, RawUpstream, bool]:
    reader = asyncio.StreamReader()
    writer = FakeWriter()
    pool = RawUpstream()
    response = _RawResponse(pool, ("h", 1), (reader, writer), head, b"")  # type: ignore[arg-type]

    async def feed() -> None:
        last = 0
        for cut in sorted(set(cuts)) + [len(wire)]:
            reader.feed_data(wire[last:cut])
            last = cut
            await asyncio.sleep(0)
        if eof:
            reader.feed_eof()

    feeder = asyncio.ensure_future(feed())
    out = b""
    try:
        async for piece in response.chunks():
            out += piece
    finally:
        await feeder
        await response.close()
    return out, pool, writer.closed


SSE = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked"


@given(pieces=st.lists(st.binary(min_size=0, max_size=40), max_size=8), cuts=st.lists(st.integers(0, 400), max_size=8))
def test_chunked_bodies_are_decoded_wherever_the_bytes_are_split(pieces: list[bytes], cuts: list[int]) -> None:
    wire = chunked(pieces)
    out, pool, closed = asyncio.run(read_all(SSE, wire, [c for c in cuts if c < len(wire)]))
    assert out == b"".join(pieces)
    assert not closed and len(pool._idle[("h", 1)]) == 1  # read to its end: the connection is kept for reuse


def test_a_sized_body_and_its_headers() -> None:
    head = b"HTTP/1.1 404 Not Found\r\ncontent-type: application/json\r\ncontent-length: 11"
    out, pool, _ = asyncio.run(read_all(head, b'{"error":1}', [3]))
    assert out == b'{"error":1}' and ("h", 1) in pool._idle


def test_a_body_broken_off_is_an_upstream_error_and_the_connection_is_dropped() -> None:
    with pytest.raises(UpstreamError):
        asyncio.run(read_all(SSE, b"5\r\nhel", [], eof=True))


def test_an_answer_not_read_to_its_end_drops_the_connection() -> None:
    async def go() -> bool:
        reader = asyncio.StreamReader()
        writer = FakeWriter()
        response = _RawResponse(RawUpstream(), ("h", 1), (reader, writer), SSE, b"")  # type: ignore[arg-type]
        reader.feed_data(b"5\r\nhello\r\n")
        async for _ in response.chunks():
            break
        await response.close()  # the client left mid-stream: the engine must see the connection close
        return writer.closed

    assert asyncio.run(go())


def test_a_replica_that_never_answers_times_out_and_a_cancel_still_cancels() -> None:
    async def go() -> tuple[float, bool]:
        server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)  # accepts, never answers
        port = server.sockets[0].getsockname()[1]
        upstream = RawUpstream(timeout_s=0.05)
        started = asyncio.get_running_loop().time()
        with pytest.raises(UpstreamError, match="no answer"):
            await upstream.post(f"http://127.0.0.1:{port}", "/v1/completions", b"{}")
        waited = asyncio.get_running_loop().time() - started
        slow = RawUpstream(timeout_s=60)
        task = asyncio.ensure_future(slow.post(f"http://127.0.0.1:{port}", "/v1/completions", b"{}"))
        await asyncio.sleep(0.05)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            cancelled = True
        else:
            cancelled = False
        server.close()
        return waited, cancelled

    waited, cancelled = asyncio.run(go())
    assert waited < 1.0 and cancelled
