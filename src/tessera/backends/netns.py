"""A private network namespace for a workload: only its own loopback, nothing of the host's network.

A model replica runs in one when the server may make it (root): whatever TCP port its engine or the engine's
helpers open (transformers serve's HTTP port behind the socket bridge, vLLM's internal ones) is reachable from
inside the replica only, never by another tenant's workload on the host's 127.0.0.1. The replica is reached
through its Unix socket, which lives in the file system (``runtime_dirs``), not in a network namespace.

The supervisor enters the namespace before it starts the command (``enter_private_network``): ``unshare`` needs
``CAP_SYS_ADMIN``, which it has only before it drops to the tenant's user. Imports only the standard library (the
supervisor does).
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import socket
import struct
import subprocess
import sys

CLONE_NEWNET = 0x40000000
SIOCGIFFLAGS = 0x8913
SIOCSIFFLAGS = 0x8914
IFF_UP = 0x1
_IFREQ = "16sh"


def enter_private_network() -> None:
    """Moves this process into a new network namespace and brings its loopback up (``OSError`` if it cannot)."""
    libc = ctypes.CDLL(None, use_errno=True)  # libc's symbols are in the process (find_library runs ldconfig)
    if libc.unshare(CLONE_NEWNET) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"unshare(CLONE_NEWNET): {os.strerror(errno)}")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack(_IFREQ, b"lo", 0)
        flags = struct.unpack(_IFREQ, fcntl.ioctl(sock, SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(sock, SIOCSIFFLAGS, struct.pack(_IFREQ, b"lo", flags | IFF_UP))


def private_network_usable(python: str = sys.executable, env: dict[str, str] | None = None) -> bool | None:
    """Whether a process started like the supervisor can make a private network namespace here (root, and no
    sandbox that forbids it): tried in a child, which the namespace leaves with. None when the child could not
    even run (a host out of processes): ask again later."""
    if os.geteuid() != 0:
        return False
    probe = "from tessera.backends.netns import enter_private_network as e; e()"
    try:
        done = subprocess.run([python, "-s", "-P", "-c", probe], env=env, capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.returncode == 0
