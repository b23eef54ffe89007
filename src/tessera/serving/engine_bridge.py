"""A replica's Unix socket in front of an engine that can only listen on TCP (transformers serve, SGLang).

``engine_exec`` runs such an engine as its child on a loopback port and relays every connection made to the
replica's socket (``$TESSERA_RUNTIME_DIR/engine.sock``) to it, byte for byte, both ways. In a replica's private
network namespace (``backends.netns``, a root server) that port is reachable from inside the replica only: the
socket, in a directory only the replica's user and the server can enter, is the one way in. The relay holds no
state of its own: the engine's answers, streams and disconnects pass through as they are.

The process ends with the engine: its exit code is the engine's; SIGTERM and SIGINT are passed on to it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import subprocess
from collections.abc import Mapping, Sequence

log = logging.getLogger(__name__)

READ_BYTES = 65536


def free_loopback_port() -> int:
    """A TCP port free on 127.0.0.1 now (in a private network namespace every one is)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(READ_BYTES):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(OSError, RuntimeError):
            if writer.can_write_eof():
                writer.write_eof()


async def _relay(port: int, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
    """One connection to the socket, relayed to the engine's port (closed at once while the engine is not up)."""
    try:
        engine_reader, engine_writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        client_writer.close()
        return
    try:
        await asyncio.gather(_pipe(client_reader, engine_writer), _pipe(engine_reader, client_writer))
    finally:
        engine_writer.close()
        client_writer.close()


async def _bridge(socket_path: str, port: int, engine: subprocess.Popen[bytes]) -> int:
    server = await asyncio.start_unix_server(lambda r, w: _relay(port, r, w), socket_path, backlog=1024)
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, engine.send_signal, signum)
    async with server:
        while engine.poll() is None:
            await asyncio.sleep(0.2)
    return engine.returncode


def run_bridged(
    argv: Sequence[str], env: Mapping[str, str], socket_path: str, port: int, cwd: str | None = None
) -> int:
    """Start the engine (``argv``, listening on 127.0.0.1:``port``) and relay ``socket_path`` to it until it ends;
    its exit code (minus N when signal N ended it)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(socket_path)  # a stale socket of an earlier run
    engine = subprocess.Popen(list(argv), env=dict(env), cwd=cwd)
    try:
        return asyncio.run(_bridge(socket_path, port, engine))
    finally:
        if engine.poll() is None:
            engine.kill()
            engine.wait()
