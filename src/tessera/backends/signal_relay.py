"""The supervisor's relay of stop signals (SIGTERM, SIGINT) to the whole workload: once CMD (or every rank of a gang)
runs, each signal the supervisor receives goes once to its process group, which holds CMD and its ranks, and to what
left the group (the cgroup's members, else the subreaper's descendants). A signal that came before CMD started is
kept (``first_signal``): the supervisor then does not start it.

Imports only the standard library, ``cgroups`` and ``reaper`` (the supervisor's).
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path
from types import FrameType

from tessera.backends import cgroups, reaper

RELAYED_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class SignalRelay:
    """Relays stop signals to the process group once CMD runs; remembers the ones that came before."""

    def __init__(self, cgroup: Path | None = None) -> None:
        self.cgroup = cgroup
        self.first_signal: int | None = None
        self.child_pids: set[int] = set()  # CMD, or the ranks of a gang, while they run
        self._relayed: set[int] = set()

    def install(self) -> None:
        for signum in RELAYED_SIGNALS:
            signal.signal(signum, self._handle)

    def child_started(self, pid: int) -> None:
        """``pid`` (CMD, or a rank) was started. A signal that arrived while it was being started was recorded but
        not relayed yet (nothing ran): it is relayed now. One relayed to the group of a gang's earlier ranks while
        this one started may have come before its fork, or before its exec replaced Python's handler: it is sent to
        this one again. (The supervisor starts no rank once a stop came.)"""
        relayed_meanwhile = self.first_signal is not None and self.first_signal in self._relayed
        self.child_pids.add(pid)
        if self.first_signal is None:
            return
        if not relayed_meanwhile:
            self._relay(self.first_signal)
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, self.first_signal)

    def child_ended(self, pid: int) -> None:
        """``pid`` was reaped: its number may name another process from now on."""
        self.child_pids.discard(pid)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.first_signal is None:
            self.first_signal = signum
        if self.child_pids:
            self._relay(signum)

    def _relay(self, signum: int) -> None:
        self._relayed.add(signum)
        if not leads_own_group():
            for pid in list(self.child_pids):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signum)
            return
        # The group includes the supervisor: ignore the signal while sending it, so it reaches only the others.
        previous = signal.signal(signum, signal.SIG_IGN)
        try:
            os.killpg(os.getpgrp(), signum)
        finally:
            signal.signal(signum, previous)
        # What left the group (setsid, a double fork): the cgroup names it, else the subreaper's tree holds it. The
        # group's own members had the signal already: each process gets it once.
        others = cgroups.members(self.cgroup) if self.cgroup is not None else reaper.descendants(os.getpid())
        for pid in others:
            with contextlib.suppress(ProcessLookupError):
                if pid != os.getpid() and os.getpgid(pid) != os.getpgrp():
                    os.kill(pid, signum)


def leads_own_group() -> bool:
    return os.getpgrp() == os.getpid()
