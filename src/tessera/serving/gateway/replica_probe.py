"""Proving a replica before the gateway sends it anything: who listens at its address, and does it answer.

A replica is registered only when ``prove_replica`` says so: its engine answers ``GET /health`` with 200 and, at a
Unix-socket address (``unix:PATH``, how ``tessera up`` runs local replicas), the process that listens there is one
of the replica workload's own (``SO_PEERCRED`` names the listener; ``owned`` says whether a process belongs to the
workload). Any 200 on ``/health`` is not enough: a process of another tenant that took the replica's address
first would answer it too. The proven listener's pid goes into the registry, and the upstream refuses later
connections served by anyone else (``upstream.peer_pid_of``).

Blocking, with a short timeout: called by the serving controller's thread when it publishes replicas.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

from tessera.serving.gateway.upstream import UNIX_SCHEME, peer_pid_of

HEALTH_REQUEST = b"GET /health HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n"


@dataclass(frozen=True, slots=True)
class Proof:
    ready: bool  # the engine answered /health with 200 and, at a socket, its listener is the replica's
    listener_pid: int | None  # who listens at a Unix socket (None over TCP, or when nothing does)
    reason: str = ""  # why not ready


def prove_replica(address: str, owned: Callable[[int], bool], timeout_s: float = 0.5) -> Proof:
    """Whether the replica at ``address`` is ready and is who it should be (see the module docstring)."""
    try:
        sock = _connect(address, timeout_s)
    except OSError as exc:
        return Proof(False, None, f"cannot connect: {exc.strerror or exc}")
    with sock:
        listener = peer_pid_of(sock)
        if listener is not None and not owned(listener):
            return Proof(False, listener, f"listened on by process {listener}, which is not the replica's")
        try:
            sock.sendall(HEALTH_REQUEST)
            status = _status(sock)
        except OSError as exc:
            return Proof(False, listener, f"no answer: {exc.strerror or exc}")
    if status != 200:
        return Proof(False, listener, f"/health answered {status}")
    return Proof(True, listener)


def _connect(address: str, timeout_s: float) -> socket.socket:
    if address.startswith(UNIX_SCHEME):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        target: str | tuple[str, int] = address[len(UNIX_SCHEME) :]
    else:
        parts = urlsplit(address)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        target = (parts.hostname or "127.0.0.1", parts.port or 80)
    sock.settimeout(timeout_s)
    try:
        sock.connect(target)
    except BaseException:
        sock.close()
        raise
    return sock


def _status(sock: socket.socket) -> int:
    """The status code of the answer's first line (0 when there is none)."""
    data = b""
    while b"\r\n" not in data and len(data) < 1024:
        chunk = sock.recv(1024)
        if not chunk:
            break
        data += chunk
    parts = data.split(b"\r\n", 1)[0].split(b" ")
    return int(parts[1]) if len(parts) >= 2 and parts[0].startswith(b"HTTP/") and parts[1].isdigit() else 0
