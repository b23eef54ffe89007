"""Proving a replica before the gateway sends it anything: who listens at its address, and does it answer.

A replica is registered only when ``prove_replica`` says so: its engine answers ``GET /health`` with 200 and, at a
Unix-socket address (``unix:PATH``, how ``tessera up`` runs local replicas), the process that listens there is one
of the replica workload's own (``SO_PEERCRED`` names the listener; ``owned`` says whether a process belongs to the
workload). Any 200 on ``/health`` is not enough: a process of another tenant that took the replica's address
first would answer it too. The proven listener's pid goes into the registry, and the upstream refuses later
connections served by anyone else (``upstream.peer_pid_of``).

Asynchronous, on the gateway's event loop, each attempt bounded by ``timeout_s``: a replica that accepts and never
answers delays nothing but its own registration.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

from tessera.serving.gateway.upstream import UNIX_SCHEME, peer_pid_of

HEALTH_REQUEST = b"GET /health HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n"


def health_request(api_key: str | None = None) -> bytes:
    """The probe's request: with the replica's key (``Authorization: Bearer``) when it requires one."""
    if api_key is None:
        return HEALTH_REQUEST
    return HEALTH_REQUEST[:-2] + b"authorization: Bearer " + api_key.encode("latin-1") + b"\r\n\r\n"


@dataclass(frozen=True, slots=True)
class Proof:
    ready: bool  # the engine answered /health with 200 and, at a socket, its listener is the replica's
    listener_pid: int | None  # who listens at a Unix socket (None over TCP, or when nothing does)
    reason: str = ""  # why not ready


async def prove_replica(
    address: str, owned: Callable[[int], bool], timeout_s: float = 0.5, api_key: str | None = None
) -> Proof:
    """Whether the replica at ``address`` is ready and is who it should be (see the module docstring); ``api_key``:
    the key it requires (a replica on a TCP port of another node), sent with the probe."""
    try:
        async with asyncio.timeout(timeout_s):
            reader, writer = await _connect(address)
    except (OSError, TimeoutError) as exc:
        return Proof(False, None, f"cannot connect: {getattr(exc, 'strerror', None) or exc or 'timed out'}")
    try:
        listener = peer_pid_of(writer.get_extra_info("socket"))
        if listener is not None and not owned(listener):
            return Proof(False, listener, f"listened on by process {listener}, which is not the replica's")
        writer.write(health_request(api_key))
        async with asyncio.timeout(timeout_s):
            status = _status(await reader.readline())
    except (OSError, TimeoutError, ValueError) as exc:
        return Proof(False, listener, f"no answer to /health: {getattr(exc, 'strerror', None) or exc or 'timed out'}")
    finally:
        writer.close()
    if status != 200:
        return Proof(False, listener, f"/health answered {status}")
    return Proof(True, listener)


async def _connect(address: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    if address.startswith(UNIX_SCHEME):
        return await asyncio.open_unix_connection(address[len(UNIX_SCHEME) :])
    parts = urlsplit(address)
    return await asyncio.open_connection(parts.hostname or "127.0.0.1", parts.port or 80)


def _status(line: bytes) -> int:
    """The status code of an answer's first line (0 when it is none)."""
    parts = line.split(b" ")
    return int(parts[1]) if len(parts) >= 2 and parts[0].startswith(b"HTTP/") and parts[1].isdigit() else 0
