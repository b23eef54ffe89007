"""The guard: the process on a Ray node that makes sure no process of a workload outlives it.

``ray.kill`` of an actor, or a lost node, kills only the actor's worker and its direct child: grandchildren keep
running (see ``../shared/ray-notes.md``), and a workload left running on a node Tessera thinks lost would run twice
once requeued. So the workload actor (``actor.py``) does not start the workload itself. It starts this guard with
``setsid -f`` (a new session, not the actor's child, so Ray does not touch it) and keeps the write end of a pipe
whose read end only the guard holds. The guard

1. starts the local backend's supervisor (``tessera.backends.supervisor``: clean environment, its own process group,
   SIGTERM relayed to the whole group, exit code file, nothing left behind once the command ends) in a session of
   its own, stdout and stderr into the node-local log;
2. reads commands from the pipe: ``term G`` (SIGTERM through the supervisor now, SIGKILL to the group after ``G``
   seconds) and ``kill`` (SIGKILL to the group at once);
3. on end of file (the actor is gone, for any reason: ``ray.kill``, a crash, its node's raylet died) SIGKILLs the
   whole group at once;
4. once the supervisor has ended, SIGKILLs whatever is left of the group, then writes the exit code to ``exit`` in
   the workload's directory (atomically): the supervisor's, else -9 when the guard killed it, else minus the
   signal that ended it.

Run as ``python -s -P -m tessera.backends.ray.guard DIR FD``; ``DIR`` holds ``argv.json`` and ``spec.json`` (the
supervisor's ``CommandSpec``) and receives ``log``, ``cmd.exit``, ``guard.pid`` and ``exit``. Standard library and
the supervisor only: it runs on any node where Tessera is installed.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

SUPERVISOR_MODULE = "tessera.backends.supervisor"
TICK_S = 0.05  # how often the guard looks at the supervisor between pipe reads
ARGV_FILE, SPEC_FILE, LOG_FILE, CMD_EXIT_FILE, EXIT_FILE, PID_FILE = (
    "argv.json",
    "spec.json",
    "log",
    "cmd.exit",
    "exit",
    "guard.pid",
)


class Guard:
    """The state of one guard: the supervisor it started and the deadline of a graceful stop."""

    def __init__(self, supervisor: subprocess.Popen[bytes], pipe_fd: int | None) -> None:
        self.supervisor = supervisor
        self.pipe_fd = pipe_fd
        self.kill_at_s: float | None = None
        self.term_sent = False
        self.killed = False
        self._pending = b""

    def kill_group(self) -> None:
        """SIGKILL to the workload's whole process group (the supervisor leads it)."""
        self.killed = True
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.supervisor.pid, signal.SIGKILL)

    def terminate(self, grace_s: float) -> None:
        """SIGTERM once through the supervisor (which relays it to the group); SIGKILL after ``grace_s``."""
        deadline_s = time.monotonic() + max(grace_s, 0.0)
        if self.kill_at_s is None or deadline_s < self.kill_at_s:
            self.kill_at_s = deadline_s
        if grace_s <= 0:
            self.kill_group()
        elif not self.term_sent:
            self.term_sent = True
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.supervisor.pid, signal.SIGTERM)

    def read_commands(self, timeout_s: float) -> None:
        """Waits up to ``timeout_s`` for the pipe and obeys what came; end of file kills the group."""
        if self.pipe_fd is None:
            time.sleep(timeout_s)
            return
        ready, _, _ = select.select([self.pipe_fd], [], [], timeout_s)
        if not ready:
            return
        data = os.read(self.pipe_fd, 4096)
        if not data:  # the actor is gone: nothing may outlive it
            os.close(self.pipe_fd)
            self.pipe_fd = None
            self.kill_group()
            return
        self._pending += data
        *lines, self._pending = self._pending.split(b"\n")
        for line in lines:
            self.obey(line.decode(errors="replace").split())

    def obey(self, words: list[str]) -> None:
        if words[:1] == ["kill"]:
            self.kill_group()
        elif words[:1] == ["term"] and len(words) == 2:
            try:
                self.terminate(float(words[1]))
            except ValueError:
                self.terminate(0.0)

    def run(self) -> int:
        """Until the supervisor ends; its exit code (see the module's doc)."""
        while self.supervisor.poll() is None:
            if self.kill_at_s is not None and not self.killed and time.monotonic() >= self.kill_at_s:
                self.kill_group()
            self.read_commands(TICK_S)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.supervisor.pid, signal.SIGKILL)  # whatever outlived it (normally nothing)
        return -signal.SIGKILL if self.killed else self.supervisor.returncode


def read_code(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def write_code(path: Path, code: int) -> None:
    temporary = path.with_name(f"{path.name}.tmp")
    temporary.write_text(f"{code}\n")
    os.replace(temporary, path)


def start_supervisor(directory: Path, python: str) -> subprocess.Popen[bytes]:
    argv = json.loads((directory / ARGV_FILE).read_text())
    command = [python, "-s", "-P", "-m", SUPERVISOR_MODULE, "--exit-file", str(directory / CMD_EXIT_FILE)]
    command += ["--spec", str(directory / SPEC_FILE), "--", *argv]
    log = os.open(directory / LOG_FILE, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        return subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd="/",
            env={k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "PYTHONPATH")},
            start_new_session=True,  # leads the workload's process group: pgid == pid
        )
    finally:
        os.close(log)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 2:
        print("usage: python -m tessera.backends.ray.guard DIR FD", file=sys.stderr)
        return 2
    directory, pipe_fd = Path(args[0]), int(args[1])
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # only the pipe tells it what to do
    (directory / PID_FILE).write_text(f"{os.getpid()}\n")
    try:
        supervisor = start_supervisor(directory, sys.executable)
    except (OSError, ValueError) as error:
        print(f"tessera guard: cannot start the supervisor: {error}", file=sys.stderr)
        write_code(directory / EXIT_FILE, 126)
        return 126
    code = Guard(supervisor, pipe_fd).run()
    written = read_code(directory / CMD_EXIT_FILE)
    write_code(directory / EXIT_FILE, written if written is not None else code)
    return 0


if __name__ == "__main__":
    sys.exit(main())
