"""Who listens at a TCP address of this host: what ``SO_PEERCRED`` says of a Unix socket, for a TCP port.

A model replica on a Ray node listens on a port of its node (``LaunchSpec.node_port``); over TCP the gateway cannot
learn which process answers it. The workload's actor, on that node, can: ``listens_only(host, port, pids)`` is True
when some socket listens where a connection to ``host:port`` would go (that address, or the wildcard address, on
that port) and every such socket is held open by one of ``pids`` (the workload's processes). The server hands the
address to the gateway only then, so a process that took the port before the engine could bind it is never sent the
replica's key or its requests.

Linux only: the listening sockets from ``/proc/net/tcp`` and ``tcp6`` (state ``0A``), their inodes matched against
``/proc/PID/fd`` links (``socket:[INODE]``; only the processes' own user, or root, can read them).
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Iterable
from pathlib import Path

from tessera.backends.procfs import PROC_ROOT

LISTEN_STATE = "0A"
WILDCARDS = (ipaddress.ip_address("0.0.0.0"), ipaddress.ip_address("::"))


def decode_address(text: str) -> tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int]:
    """``/proc/net/tcp``'s ``ADDR:PORT`` (the address in hex, 32-bit words in host byte order: little-endian)."""
    address, _, port = text.partition(":")
    raw = bytes.fromhex(address)
    swapped = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    ip = ipaddress.ip_address(swapped)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped, int(port, 16)
    return ip, int(port, 16)


def listening_inodes(host: str, port: int, proc_root: Path = PROC_ROOT) -> set[int]:
    """The inodes of the sockets that listen where a connection to ``host:port`` would go: bound to that address
    or to a wildcard one, on that port."""
    wanted = ipaddress.ip_address(host)
    inodes: set[int] = set()
    for table in ("tcp", "tcp6"):
        try:
            lines = (proc_root / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or fields[3] != LISTEN_STATE:
                continue
            address, bound_port = decode_address(fields[1])
            if bound_port == port and (address == wanted or address in WILDCARDS):
                inodes.add(int(fields[9]))
    return inodes


def socket_inodes(pid: int, proc_root: Path = PROC_ROOT) -> set[int]:
    """The inodes of the sockets process ``pid`` holds open (none when it is gone or not ours to read)."""
    found: set[int] = set()
    try:
        entries = list(os.scandir(proc_root / str(pid) / "fd"))
    except OSError:
        return found
    for entry in entries:
        try:
            target = os.readlink(entry.path)
        except OSError:
            continue
        if target.startswith("socket:["):
            found.add(int(target[8:-1]))
    return found


def listens_only(host: str, port: int, pids: Iterable[int], proc_root: Path = PROC_ROOT) -> bool:
    """Whether something listens where ``host:port`` leads, and only the processes ``pids`` hold those sockets."""
    inodes = listening_inodes(host, port, proc_root)
    if not inodes:
        return False
    held: set[int] = set()
    for pid in pids:
        held |= socket_inodes(pid, proc_root)
    return inodes <= held
