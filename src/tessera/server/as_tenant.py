"""File work the server does for a tenant, done with the tenant's permissions: ``as_account(account)`` gives the
calling thread that account's filesystem identity (fsuid, fsgid and supplementary groups) until the block ends.

The kernel then checks every open, stat and directory search of that thread as it checks the tenant's own
workload: a path the tenant may not read is not read, whatever links or races lie on the way (the check is the
kernel's, at each access, not a look at permission bits beforehand). A server running as root loses its file
powers meanwhile (``CAP_DAC_OVERRIDE``, ``CAP_DAC_READ_SEARCH``...: the kernel clears them from the effective set
while the fsuid is not 0, and gives them back when it returns to 0). The other threads of the server keep theirs:
``setfsuid``, ``setfsgid`` and the raw ``setgroups`` system call change the calling thread only (glibc's
``setgroups`` would change every thread, so it is not used).

Who calls it: the model-cache keeper (``server.model_cache``), which measures, reads in and lets go of a tenant's
model weights on its own background thread. Linux on x86-64 and arm64; elsewhere, and when the server is not root
and an account other than its own is asked for, ``TenantFilesError`` (the caller then leaves the files alone).
"""

from __future__ import annotations

import ctypes
import os
import platform
from collections.abc import Iterator
from contextlib import contextmanager

from tessera.backends.accounts import Account
from tessera.errors import TesseraError

_SETGROUPS = {"x86_64": 116, "aarch64": 159}  # the raw system call's number (per thread, unlike glibc's wrapper)
_libc = ctypes.CDLL(None, use_errno=True)


class TenantFilesError(TesseraError):
    """The thread could not take (or give back) an account's identity."""


@contextmanager
def as_account(account: Account | None) -> Iterator[None]:
    """Run the block with ``account``'s filesystem identity on this thread (None, or the server's own account:
    as it is)."""
    if account is None or (account.uid == os.geteuid() and account.gid == os.getegid()):
        yield
        return
    if os.geteuid() != 0:
        raise TenantFilesError(f"only a root server reads files as another user ({account.name})")
    number = _SETGROUPS.get(platform.machine())
    if number is None:
        raise TenantFilesError(f"reading files as a tenant is not supported on {platform.machine()}")
    own = (os.geteuid(), os.getegid(), tuple(os.getgroups()))
    try:
        _set_identity(number, account.uid, account.gid, account.groups)
        yield
    finally:
        _set_identity(number, *own)  # raises if it cannot: the thread must not go on as the tenant


def _set_identity(number: int, uid: int, gid: int, groups: tuple[int, ...]) -> None:
    array = (ctypes.c_uint * max(1, len(groups)))(*groups)
    if _libc.syscall(number, len(groups), array) != 0:
        raise TenantFilesError(f"setgroups: {os.strerror(ctypes.get_errno())}")
    _libc.setfsgid(gid)
    _libc.setfsuid(uid)
    # Both return the previous value and report no error: asking again with the same value returns the current one.
    if _libc.setfsgid(gid) != gid or _libc.setfsuid(uid) != uid:
        raise TenantFilesError(f"could not take the filesystem identity {uid}:{gid}")
