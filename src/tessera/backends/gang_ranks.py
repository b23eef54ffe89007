"""The supervisor's side of a gang (``base.GangRanks``): one process per rank of a multi-worker job, started
together, supervised as one workload.

- **Environment.** Each rank runs CMD with the workload's environment plus torchrun's variables: ``WORLD_SIZE``,
  ``RANK``, ``LOCAL_RANK`` (its index in the launch's ranks), ``LOCAL_WORLD_SIZE`` (the launch's ranks),
  ``MASTER_ADDR`` and ``MASTER_PORT``. A gang without a port (``master_port`` 0: this launch runs rank 0) gets one
  picked here, once for every rank: a free port of ``master_addr`` (bound to port 0, read, closed).
- **Logs.** Rank ``r`` logs to ``rank_log_path(log, r)``: rank 0 to the workload's log (the supervisor's stdout, as
  a single CMD), every other rank through a pipe of its own (``log_pipe``) into its own file under the same cap,
  opened by the supervisor and given the main log's owner and mode. Without a log in the spec, every rank writes to
  the supervisor's stdout.
- **Signals.** The ranks share the supervisor's process group, so a stop the supervisor relays reaches every rank
  (``signal_relay``). No rank is started once a stop came.
- **Ends.** Ranks are reaped as they end. The first that fails (a nonzero exit code, a signal, or a command that
  could not be started: 127/126) is said in the workload's log ("rank R exited with code C: stopping the other
  ranks"), and the other ranks (each with what it started) get SIGTERM, then SIGKILL after ``GANG_STOP_GRACE_S``;
  ranks not started yet are not started. Under a stop from outside, the ranks' ends are only recorded: that stop's
  own grace holds. The gang's exit code is the first failure's, 0 when every rank exited 0.

Imports only the standard library and the supervisor's own modules.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from tessera.backends import reaper
from tessera.backends.base import GangRanks, rank_log_path
from tessera.backends.command_spec import CommandSpec
from tessera.backends.command_start import EXIT_CANNOT_EXECUTE, start_command
from tessera.backends.log_pipe import LogPipe
from tessera.backends.signal_relay import SignalRelay

logger = logging.getLogger("tessera.backends.supervisor")

GANG_STOP_GRACE_S = 5.0  # after a rank failed, the others' SIGTERM grace before SIGKILL
REAP_POLL_S = 0.05  # how often the supervisor looks for ended ranks while a grace runs


def rank_env(base: Mapping[str, str], gang: GangRanks, local_rank: int, master_port: int) -> dict[str, str]:
    """The environment of the rank at ``local_rank`` of ``gang``: ``base`` and torchrun's variables."""
    return {
        **base,
        "WORLD_SIZE": str(gang.world_size),
        "RANK": str(gang.ranks[local_rank]),
        "LOCAL_RANK": str(local_rank),
        "LOCAL_WORLD_SIZE": str(len(gang.ranks)),
        "MASTER_ADDR": gang.master_addr,
        "MASTER_PORT": str(master_port),
    }


def pick_master_port(master_addr: str) -> int:
    """A TCP port free on ``master_addr`` now (the kernel's choice); ``OSError`` when none can be bound there."""
    family, kind, proto, _, address = socket.getaddrinfo(master_addr, 0, type=socket.SOCK_STREAM)[0]
    with socket.socket(family, kind, proto) as probe:
        probe.bind(address)
        port: int = probe.getsockname()[1]
        return port


def open_rank_logs(spec: CommandSpec, main: LogPipe | None) -> tuple[dict[int, LogPipe], int]:
    """The pipes of the ranks that log apart (every rank but 0, when the spec names a log: ``main`` is its pipe),
    started: (pipes by rank; 0, or 126 when one cannot be set up: then no rank is started)."""
    pipes: dict[int, LogPipe] = {}
    if spec.gang is None or spec.log is None or main is None:
        return pipes, 0
    for rank in (r for r in spec.gang.ranks if r != 0):
        path = rank_log_path(Path(spec.log), rank)
        try:
            fd = _open_like(path, main.log.fd)
            try:
                pipe = LogPipe(path, spec.log_max_bytes, fd)
            finally:
                os.close(fd)
            pipe.start_apart()
        except (OSError, RuntimeError) as error:  # RuntimeError: no thread (the pids limit)
            why = getattr(error, "strerror", None) or error
            logger.error("cannot open the log %s of rank %d (%s): no rank is started", path, rank, why)
            return pipes, EXIT_CANNOT_EXECUTE
        pipes[rank] = pipe
    return pipes, 0


def _open_like(path: Path, like_fd: int) -> int:
    """``path`` open for appending; created with the owner and mode of the file open at ``like_fd`` (the main log),
    so that whoever reads that one reads this one too."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    like, mine = os.fstat(like_fd), os.fstat(fd)
    if mine.st_size == 0 and (mine.st_uid, mine.st_gid) != (like.st_uid, like.st_gid):
        with contextlib.suppress(PermissionError):
            os.fchown(fd, like.st_uid, like.st_gid)
    if mine.st_size == 0:
        os.fchmod(fd, like.st_mode & 0o777)
    return fd


@dataclass(slots=True)
class _Gang:
    """The ranks running and the first failure, while the supervisor waits for them."""

    relay: SignalRelay
    running: dict[int, tuple[int, subprocess.Popen[bytes]]] = field(default_factory=dict)  # pid -> (rank, process)
    failure: tuple[int, int] | None = None  # (rank, exit code) of the first rank that failed
    kill_at_s: float | None = None  # when the others get SIGKILL (after a failure)
    started: int = 0  # ranks started

    def ended(self, rank: int, exit_code: int) -> None:
        if exit_code == 0 or self.failure is not None:
            return
        self.failure = (rank, exit_code)
        how = f"exited with code {exit_code}" if exit_code > 0 else f"was ended by signal {_signal_name(-exit_code)}"
        if self.relay.first_signal is not None:  # stopped from outside: that stop's grace holds, not ours
            logger.info("rank %d %s", rank, how)
            return
        logger.warning("rank %d %s%s", rank, how, ": stopping the other ranks" if self.running else "")
        self.kill_at_s = time.monotonic() + GANG_STOP_GRACE_S
        self.signal_ranks(signal.SIGTERM)

    def signal_ranks(self, signum: int) -> None:
        """Signals every running rank and what it started (the ranks share the supervisor's group)."""
        for pid in list(self.running):
            for target in (pid, *reaper.descendants(pid)):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(target, signum)

    def reap(self) -> None:
        """Waits until every rank has ended, reaping orphans meanwhile; SIGKILLs the rest once a grace is over."""
        while self.running:
            waiting = self.kill_at_s is not None
            pid, status = os.waitpid(-1, os.WNOHANG if waiting else 0)
            if pid == 0:
                assert self.kill_at_s is not None
                if time.monotonic() >= self.kill_at_s:
                    logger.warning("ranks %s did not stop within %.0f s: SIGKILL", self._ranks(), GANG_STOP_GRACE_S)
                    self.signal_ranks(signal.SIGKILL)
                    self.kill_at_s = None  # SIGKILLed: wait for them without a deadline
                else:
                    time.sleep(REAP_POLL_S)
                continue
            if pid in self.running:
                rank, process = self.running.pop(pid)
                process.returncode = code = os.waitstatus_to_exitcode(status)  # waited for here, not by Popen
                self.relay.child_ended(pid)
                self.ended(rank, code)

    def _ranks(self) -> list[int]:
        return sorted(rank for rank, _ in self.running.values())


def run_gang(command: list[str], relay: SignalRelay, spec: CommandSpec, pipes: dict[int, LogPipe]) -> int:
    """Runs one CMD per rank of ``spec.gang`` to their end (see the module's doc); the gang's exit code (negative:
    a signal; 127/126: a rank could not be started)."""
    gang = spec.gang
    assert gang is not None
    if relay.first_signal is not None:  # told to stop before any rank started: start none
        return -relay.first_signal
    try:
        port = gang.master_port or pick_master_port(gang.master_addr)
    except OSError as error:
        logger.error("cannot pick a MASTER_PORT on %s (%s): no rank is started", gang.master_addr, error)
        return EXIT_CANNOT_EXECUTE
    state = _Gang(relay)
    base = dict(spec.env if spec.env is not None else os.environ)
    for local_rank, rank in enumerate(gang.ranks):
        if relay.first_signal is not None:  # a stop came while the gang started: the rest are not started
            break
        pipe = pipes.get(rank)
        env = rank_env(base, gang, local_rank, port)
        started = start_command(command, spec, env, None if pipe is None else pipe.writer_fd)
        if pipe is not None:
            pipe.release_writer()  # the rank holds it now: its pipe ends when the rank (and what it started) ends
        if isinstance(started, int):
            state.ended(rank, started)
            break
        state.running[started.pid] = (rank, started)
        state.started += 1
        relay.child_started(started.pid)
    state.reap()
    if state.failure is not None:
        return state.failure[1]
    if state.started < len(gang.ranks) and relay.first_signal is not None:  # stopped before every rank started
        return -relay.first_signal
    return 0


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:  # a real-time signal has no name
        return str(signum)
