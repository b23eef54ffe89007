"""The supervisor as a child subreaper: the fallback containment where no cgroup is usable (``cgroups.py``).

With ``PR_SET_CHILD_SUBREAPER`` set, a process whose parent dies is re-parented to the nearest subreaper among its
ancestors instead of to init, so every process a workload starts stays a descendant of its supervisor, whatever it
does (``setsid``, a double fork, ``nohup``). When CMD ends, the supervisor SIGKILLs all its descendants, reaping them,
until none is left. What this cannot do: contain anything once the supervisor itself has been SIGKILLed (orphans
then go to init); only a cgroup does that.

Imports only the standard library and ``procfs`` (which does too): the supervisor loads it before anything else.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time

from tessera.backends import procfs

PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>
KILL_TIMEOUT_S = 5.0


def become_subreaper() -> bool:
    """Makes the calling process a child subreaper; False where the kernel refuses (or this is not Linux)."""
    import ctypes  # here, not at the top: the supervisor imports this module before its signal relay is set

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def descendants(pid: int) -> list[int]:
    """The live (not zombie) processes below ``pid`` in the process tree, from one scan of ``/proc``."""
    children: dict[int, list[int]] = {}
    for stat in filter(None, map(procfs.read_proc_stat, procfs.all_pids())):
        if not procfs.is_gone(stat):
            children.setdefault(stat.ppid, []).append(stat.pid)
    found: list[int] = []
    todo = list(children.get(pid, []))
    while todo:
        child = todo.pop()
        found.append(child)
        todo.extend(children.get(child, []))
    return found


def reap_children() -> None:
    """Collects every child of the caller that has ended (orphans re-parented to a subreaper end as its zombies)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def kill_descendants(timeout_s: float = KILL_TIMEOUT_S) -> list[int]:
    """SIGKILLs every descendant of the caller, again until none is left (or ``timeout_s``); returns those left."""
    deadline_s = time.monotonic() + timeout_s
    while True:
        reap_children()
        left = descendants(os.getpid())
        if not left or time.monotonic() > deadline_s:
            return left
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.005)
