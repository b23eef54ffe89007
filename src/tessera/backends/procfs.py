"""What Linux's ``/proc`` says about a process: alive or not, when it started, which process group it is in.

Used by the local backend to tell whether a workload it did not start itself (adopted after a server restart) is
still running, and to make sure a reused PID is never mistaken for the workload. Linux only.
"""

from __future__ import annotations

import os
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

PROC_ROOT = Path("/proc")
_GONE_STATES = frozenset({"Z", "X", "x"})  # zombie or dead: the process has ended, only its entry is left


@dataclass(frozen=True, slots=True)
class ProcStat:
    pid: int
    state: str  # one letter: R running, S sleeping, D disk wait, Z zombie, ...
    ppid: int
    pgid: int
    start_marker: str  # field 22 of /proc/PID/stat: start time in clock ticks since boot


def read_proc_stat(pid: int) -> ProcStat | None:
    """The process's entry in ``/proc``, or None if there is no such process."""
    try:
        text = (PROC_ROOT / str(pid) / "stat").read_text()
    except OSError:  # no such process, or it ended while we read
        return None
    # "PID (COMM) STATE PPID PGRP ... STARTTIME ...": COMM may hold spaces and ")", so split after the last ")".
    fields = text[text.rindex(")") + 2 :].split()
    # fields[0] is field 3 of the man page (state); field N is fields[N - 3].
    return ProcStat(pid=pid, state=fields[0], ppid=int(fields[1]), pgid=int(fields[2]), start_marker=fields[19])


def is_alive(pid: int) -> bool:
    """True if ``pid`` names a process that has not ended (a zombie has)."""
    stat = read_proc_stat(pid)
    return stat is not None and not is_gone(stat)


def read_start_marker(pid: int) -> str | None:
    """The process's start time as ``/proc`` reports it (the ``started_marker`` of a local backend handle)."""
    stat = read_proc_stat(pid)
    return None if stat is None else stat.start_marker


def is_running(pid: int, start_marker: str) -> bool:
    """True if ``pid`` is the process that started at ``start_marker`` and it has not ended (zombies have ended)."""
    stat = read_proc_stat(pid)
    return stat is not None and stat.start_marker == start_marker and stat.state not in _GONE_STATES


def is_pid_reused(pid: int, start_marker: str) -> bool:
    """True if ``pid`` now names a different process than the one that started at ``start_marker``."""
    stat = read_proc_stat(pid)
    return stat is not None and stat.start_marker != start_marker


def is_gone(stat: ProcStat) -> bool:
    """True if the process has ended and only its entry is left (a zombie)."""
    return stat.state in _GONE_STATES


def all_pids() -> list[int]:
    """Every process id ``/proc`` lists now."""
    return [int(entry.name) for entry in os.scandir(PROC_ROOT) if entry.name.isdigit()]


def read_cmdline(pid: int) -> list[str] | None:
    """The process's command line, or None if there is no such process (or it is a kernel thread, with none)."""
    try:
        raw = (PROC_ROOT / str(pid) / "cmdline").read_bytes()
    except OSError:
        return None
    return raw.rstrip(b"\0").decode(errors="surrogateescape").split("\0") if raw else None


def read_environ(pid: int) -> dict[str, str] | None:
    """The environment the process was started with; None if there is no such process. Raises
    ``PermissionError`` for another user's process (only root, or its own user, may read it)."""
    try:
        raw = (PROC_ROOT / str(pid) / "environ").read_bytes()
    except PermissionError:
        raise
    except OSError:
        return None
    pairs = (item.partition("=") for item in raw.decode(errors="surrogateescape").split("\0") if item)
    return {name: value for name, _, value in pairs}


def live_group_members(pgid: int) -> list[int]:
    """PIDs of the processes of group ``pgid`` that have not ended (scans ``/proc``)."""
    return live_members_of_groups({pgid}).get(pgid, [])


def live_members_of_groups(pgids: Collection[int]) -> dict[int, list[int]]:
    """PIDs of the processes of the groups ``pgids`` that have not ended, by group (groups with none are left out):
    one scan of ``/proc`` for all of them, as cheap as for one (a scan reads every process's ``stat``: many
    milliseconds on a busy host, so one per ended workload made a wave of ends take seconds)."""
    wanted = set(pgids)
    members: dict[int, list[int]] = {}
    if not wanted:
        return members
    for entry in os.scandir(PROC_ROOT):
        if not entry.name.isdigit():
            continue
        try:
            with open(os.path.join(entry.path, "stat"), "rb") as file:
                text = file.read()
            # After the last ")" (COMM may hold spaces and ")"): " STATE PPID PGRP ..."
            state, _ppid, pgrp = text[text.rindex(b")") + 2 :].split(maxsplit=3)[:3]
            pgid = int(pgrp)
        except (OSError, ValueError):  # ended while we read, or a malformed entry: not one of ours
            continue
        if pgid in wanted and state.decode() not in _GONE_STATES:
            members.setdefault(pgid, []).append(int(entry.name))
    return members
