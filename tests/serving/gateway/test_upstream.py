"""RawUpstream: its response reading without a socket (a StreamReader fed by hand, the bytes split anywhere); with
in-process servers, its timeouts, the proof of who listens on a replica's Unix socket, the idle connections it
closes and the stream gap it bounds."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tessera.serving.gateway.replica_probe import Proof, prove_replica
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


async def _serve_unix(path: str, answer: bytes) -> asyncio.AbstractServer:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await reader.readuntil(b"\r\n\r\n"):
            writer.write(answer)

    return await asyncio.start_unix_server(lambda r, w: handle(r, w), path)


OK = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"


def test_a_unix_socket_served_by_another_process_than_the_proven_one_is_refused(tmp_path: Path) -> None:
    """The gateway registers a replica with the pid proven to listen on its socket; a connection that some other
    process answers (an impostor who took the address) must never carry a request."""

    async def go() -> None:
        path = str(tmp_path / "engine.sock")
        server = await _serve_unix(path, OK)
        upstream = RawUpstream(timeout_s=5)
        try:
            assert await upstream.call("GET", f"unix:{path}", "/health", peer_pid=os.getpid()) == (200, b"{}")
            with pytest.raises(UpstreamError, match="not by the replica"):
                await upstream.post(f"unix:{path}", "/v1/completions", b"{}", peer_pid=os.getpid() + 1)
        finally:
            await upstream.aclose()
            server.close()

    asyncio.run(go())


def test_prove_replica_wants_health_and_a_listener_of_the_replicas_own(tmp_path: Path) -> None:
    async def go() -> list[Proof]:
        path = str(tmp_path / "engine.sock")
        server = await _serve_unix(path, OK)
        proofs = []
        for owned in (lambda pid: pid == os.getpid(), lambda pid: False):
            proofs.append(await prove_replica(f"unix:{path}", owned, 2.0))
        server.close()
        proofs.append(await prove_replica(f"unix:{tmp_path / 'none.sock'}", lambda pid: True))
        return proofs

    mine, impostor, nothing = asyncio.run(go())
    assert mine.ready and mine.listener_pid == os.getpid()
    assert not impostor.ready and "not the replica's" in impostor.reason
    assert not nothing.ready and nothing.listener_pid is None


def test_idle_connections_the_replica_closed_or_that_left_are_closed_not_kept_in_close_wait() -> None:
    """Three deploy -> stream -> delete cycles once exhausted the server's descriptors: pooled connections to
    replicas that had gone stayed open (CLOSE_WAIT). Now the replica's close is noticed by the sweep, and a
    replica that leaves the registry has its idle connections dropped at once."""

    async def go() -> tuple[int, int, int]:
        writers: list[asyncio.StreamWriter] = []

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writers.append(writer)
            await reader.readuntil(b"\r\n\r\n")
            writer.write(OK)

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        upstream = RawUpstream(timeout_s=5)
        await asyncio.gather(*(upstream.call("POST", url, "/v1/completions", b"{}") for _ in range(3)))
        kept = upstream.idle_connections()
        for writer in writers[:2]:
            writer.close()  # the replica ends two of them
        await asyncio.sleep(1.5)  # a sweep
        after_close = upstream.idle_connections()
        upstream.forget(url)  # the replica leaves
        after_forget = upstream.idle_connections()
        server.close()
        await upstream.aclose()
        return kept, after_close, after_forget

    assert asyncio.run(go()) == (3, 1, 0)


def test_a_stream_that_stalls_ends_with_an_error_after_the_chunk_gap() -> None:
    """A replica stopped mid-answer (SIGSTOP) once held a client's stream for ever."""

    async def go() -> bytes:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(SSE + b"\r\n\r\n" + b"6\r\ndata: \r\n")  # one chunk, then silence
            await asyncio.sleep(60)

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        upstream = RawUpstream(timeout_s=5, chunk_gap_s=0.3)
        response = await upstream.post(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", "/v1/x", b"{}")
        got = b""
        with pytest.raises(UpstreamError, match="no data from the replica for 0.3 s"):
            async for chunk in response.chunks():
                got += chunk
        await response.close()
        server.close()
        return got

    assert asyncio.run(go()) == b"data: "


def test_a_replica_that_answers_garbage_is_an_upstream_error_not_a_crash() -> None:
    """A tenant's own replica may answer anything: the gateway answers 502 for it, never fails itself."""

    async def go() -> list[str]:
        errors = []
        for answer in (b"NONSENSE\r\n\r\n", SSE + b"\r\n\r\nzz\r\n"):

            async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter, answer: bytes = answer) -> None:
                await r.readuntil(b"\r\n\r\n")
                w.write(answer)

            server = await asyncio.start_server(handle, "127.0.0.1", 0)
            upstream = RawUpstream(timeout_s=5)
            try:
                response = await upstream.post(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", "/x", b"{}")
                async for _ in response.chunks():
                    pass
            except UpstreamError as exc:
                errors.append(str(exc))
            server.close()
        return errors

    assert [e.split(" sent ")[-1] for e in asyncio.run(go())] == ["a malformed answer head", "a malformed chunk"]
