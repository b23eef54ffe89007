"""The small program the local backend puts between the server and a workload's command.

``LocalBackend.launch`` runs ``python -m tessera.backends.supervisor --exit-file PATH -- CMD ARGS...`` in a new
session, so the supervisor leads the workload's process group and outlives a server killed with ``kill -9``; its
stdout and stderr go to the workload's log, and CMD inherits them. The supervisor

1. starts CMD as its child, in the same process group;
2. relays SIGTERM and SIGINT to the whole group (CMD and whatever CMD started), once per signal it receives;
3. waits for CMD and writes CMD's exit code to the exit file atomically (temporary file, then ``os.replace``):
   the code CMD exited with, minus N if a signal N killed it, 127 if CMD was not found, 126 if it could not be run;
4. kills what is left of the group with SIGKILL, itself included, so nothing of the workload outlives CMD.

If a stop signal arrives before CMD started, CMD is not started and the exit code is minus that signal.
Imports only the standard library. Linux (POSIX process groups) only.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

# Not __name__: run with ``-m`` this module is "__main__".
logger = logging.getLogger("tessera.backends.supervisor")

EXIT_CANNOT_EXECUTE = 126
EXIT_NOT_FOUND = 127
RELAYED_SIGNALS = (signal.SIGTERM, signal.SIGINT)
USAGE = "usage: python -m tessera.backends.supervisor --exit-file PATH -- CMD [ARGS...]"


class _SignalRelay:
    """Relays stop signals to the process group once CMD runs; remembers the ones that came before."""

    def __init__(self) -> None:
        self.first_signal: int | None = None
        self.child_pid: int | None = None
        self._relayed: set[int] = set()

    def install(self) -> None:
        for signum in RELAYED_SIGNALS:
            signal.signal(signum, self._handle)

    def child_started(self, pid: int) -> None:
        self.child_pid = pid
        # A signal that arrived while CMD was being started was recorded but could not be relayed yet.
        if self.first_signal is not None and self.first_signal not in self._relayed:
            self._relay(self.first_signal)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.first_signal is None:
            self.first_signal = signum
        if self.child_pid is not None:
            self._relay(signum)

    def _relay(self, signum: int) -> None:
        self._relayed.add(signum)
        if not leads_own_group():
            assert self.child_pid is not None
            os.kill(self.child_pid, signum)
            return
        # The group includes the supervisor: ignore the signal while sending it, so it reaches only the others.
        previous = signal.signal(signum, signal.SIG_IGN)
        try:
            os.killpg(os.getpgrp(), signum)
        finally:
            signal.signal(signum, previous)


def leads_own_group() -> bool:
    return os.getpgrp() == os.getpid()


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:  # a real-time signal has no name
        return str(signum)


def split_args(argv: Sequence[str]) -> tuple[Path, list[str]]:
    """``--exit-file PATH -- CMD ARGS...`` -> (exit file, command); raises ValueError on anything else."""
    if "--" not in argv:
        raise ValueError("missing '--' before the command")
    cut = list(argv).index("--")
    options, command = list(argv[:cut]), list(argv[cut + 1 :])
    if len(options) != 2 or options[0] != "--exit-file" or not options[1]:
        raise ValueError("expected exactly '--exit-file PATH' before '--'")
    if not command:
        raise ValueError("no command after '--'")
    return Path(options[1]), command


def run_command(command: list[str], relay: _SignalRelay) -> int:
    """Runs CMD to its end; its exit code (negative: killed by that signal; 127/126: could not be started)."""
    if relay.first_signal is not None:  # told to stop before CMD started: do not start it
        return -relay.first_signal
    try:
        child = subprocess.Popen(command)  # inherits stdin/stdout/stderr, environment, directory and process group
    except FileNotFoundError:
        logger.error("cannot run %r: command not found", command[0])
        return EXIT_NOT_FOUND
    except PermissionError:
        logger.error("cannot run %r: permission denied (not an executable file)", command[0])
        return EXIT_CANNOT_EXECUTE
    except OSError as error:
        logger.error("cannot run %r: %s", command[0], error.strerror or error)
        return EXIT_CANNOT_EXECUTE
    relay.child_started(child.pid)
    return child.wait()  # a relayed signal interrupts the wait, which then resumes (PEP 475)


def write_exit_code(exit_file: Path, exit_code: int) -> None:
    """Writes ``exit_code`` so that a reader sees either no file or the whole code, never a partial one."""
    temporary = exit_file.with_name(f"{exit_file.name}.{os.getpid()}.tmp")
    with open(temporary, "w") as handle:
        handle.write(f"{exit_code}\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, exit_file)


def end_process_group() -> None:
    """SIGKILLs every process left in the supervisor's group, the supervisor included (so this does not return)."""
    sys.stdout.flush()
    sys.stderr.flush()
    if leads_own_group():
        os.killpg(os.getpgrp(), signal.SIGKILL)
    logger.warning("not leading a process group: processes that the command left behind are not killed")


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="tessera-supervisor: %(message)s", stream=sys.stderr)
    try:
        exit_file, command = split_args(sys.argv[1:] if argv is None else argv)
    except ValueError as error:
        logger.error("%s\n%s", error, USAGE)
        return 2
    relay = _SignalRelay()
    relay.install()
    exit_code = run_command(command, relay)
    if exit_code < 0:
        logger.info("%r was ended by signal %s", command[0], signal_name(-exit_code))
    try:
        write_exit_code(exit_file, exit_code)
    except OSError as error:
        logger.error("cannot write the exit code %d to %s: %s", exit_code, exit_file, error)
    end_process_group()
    return exit_code if exit_code >= 0 else 128 - exit_code  # reached only when not leading a process group


if __name__ == "__main__":
    sys.exit(main())
