"""The small program the local backend puts between the server and a workload's command.

``LocalBackend.launch`` runs ``python -s -P -m tessera.backends.supervisor --exit-file PATH [--spec PATH] -- CMD
ARGS...`` in a new session, with an environment of its own (never the tenant's: no ``PYTHONPATH``, ``PYTHONHOME`` or
``LD_PRELOAD`` of theirs reaches this program, and ``-P`` keeps the working directory off ``sys.path``), so the
supervisor leads the workload's process group and outlives a server killed with ``kill -9``; its stdout and stderr
go to the workload's log (opened by the server). The supervisor

1. reads and deletes the spec file (``CommandSpec``: CMD's environment, directory, user, umask, cgroups and log),
   makes itself a child subreaper (``reaper.py``) and moves itself into the workload's cgroups (``cgroups.py``: the
   one that contains it, and those of its limits in cgroup v1 hierarchies) if any;
2. starts CMD as its child, in the same process group (as the tenant's user when the spec names one), its stdout
   and stderr a pipe whose bytes a thread of the supervisor writes to the log under the log's cap (``log_pipe.py``;
   without a log in the spec, CMD inherits the supervisor's stdout and stderr), the OOM killer's choice before the
   supervisor (``oom_score.py``);
3. relays SIGTERM and SIGINT to the whole workload (the group, and the cgroup's members or its descendants: what
   left the group too), once per signal it receives;
4. waits for CMD (reaping orphans meanwhile), says so if the OOM killer ended it, copies the rest of its output,
   and writes CMD's exit code to the exit file atomically (temporary file, then ``os.replace``): the code CMD
   exited with, minus N if a signal N killed it, 127 if CMD was not found, 126 if it could not be run;
5. kills what is left of the workload with SIGKILL (the cgroup, its descendants, the group), itself last, so nothing
   of the workload outlives CMD.

If a stop signal arrives before CMD started, CMD is not started and the exit code is minus that signal. Nor is it
(exit code 126, the reason in one line of the log) when the supervisor cannot give it all it was told it has: a
limit cgroup it cannot join, a log pipe it cannot set up (no thread: the host out of PIDs), a private network it
cannot make.
Imports only the standard library. Linux (POSIX process groups) only.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pwd
import shutil
import signal
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from types import FrameType

from tessera.backends import cgroups, oom_score, reaper
from tessera.backends.log_pipe import LogPipe

# Not __name__: run with ``-m`` this module is "__main__".
logger = logging.getLogger("tessera.backends.supervisor")

EXIT_CANNOT_EXECUTE = 126
EXIT_NOT_FOUND = 127
RELAYED_SIGNALS = (signal.SIGTERM, signal.SIGINT)
USAGE = "usage: python -m tessera.backends.supervisor --exit-file PATH [--spec PATH] -- CMD [ARGS...]"


@dataclass(frozen=True, slots=True)
class CommandSpec:
    """How CMD runs, as the local backend writes it to the spec file (JSON, 0600, read once and deleted). Without
    one, CMD inherits the supervisor's environment, directory and user."""

    env: dict[str, str] | None = None  # CMD's whole environment
    cwd: str | None = None
    uid: int | None = None  # run CMD as this user (the supervisor must be root)
    gid: int | None = None
    groups: tuple[int, ...] | None = None
    umask: int | None = None
    cgroup: str | None = None  # the workload's cgroup directory, which the supervisor joins
    cgroup_kind: str | None = None  # cgroups.KINDS
    limit_cgroups: tuple[str, ...] = ()  # its cgroups in v1 hierarchies of its limits (cgroup_limits), joined too
    log: str | None = None  # the log (the supervisor's stdout): CMD's output is written there under the cap
    log_max_bytes: int = 0  # the log's cap (0: none)
    private_network: bool = False  # enter a network namespace of its own first (``netns``; needs root)

    def to_json(self) -> dict[str, object]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_json(cls, value: object) -> CommandSpec:
        if not isinstance(value, dict) or not set(value) <= {f.name for f in fields(cls)}:
            raise ValueError("not a command spec")
        groups = value.get("groups")
        limit_cgroups = tuple(value.get("limit_cgroups", ()))
        return cls(**{**value, "groups": None if groups is None else tuple(groups), "limit_cgroups": limit_cgroups})


def read_spec(path: Path) -> CommandSpec:
    """The spec file's contents; the file is deleted (it may hold the tenant's secrets)."""
    try:
        return CommandSpec.from_json(json.loads(path.read_text()))
    finally:
        path.unlink(missing_ok=True)


class _SignalRelay:
    """Relays stop signals to the process group once CMD runs; remembers the ones that came before."""

    def __init__(self, cgroup: Path | None = None) -> None:
        self.cgroup = cgroup
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
        # What left the group (setsid, a double fork): the cgroup names it, else the subreaper's tree holds it. The
        # group's own members had the signal already: each process gets it once.
        others = cgroups.members(self.cgroup) if self.cgroup is not None else reaper.descendants(os.getpid())
        for pid in others:
            with contextlib.suppress(ProcessLookupError):
                if pid != os.getpid() and os.getpgid(pid) != os.getpgrp():
                    os.kill(pid, signum)


def leads_own_group() -> bool:
    return os.getpgrp() == os.getpid()


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:  # a real-time signal has no name
        return str(signum)


def split_args(argv: Sequence[str]) -> tuple[Path, Path | None, list[str]]:
    """``--exit-file PATH [--spec PATH] -- CMD ARGS...`` -> (exit file, spec file, command); raises ValueError on
    anything else. (``--exit-file PATH`` comes first: recovery finds a supervisor by it in ``/proc/PID/cmdline``.)"""
    if "--" not in argv:
        raise ValueError("missing '--' before the command")
    cut = list(argv).index("--")
    options, command = list(argv[:cut]), list(argv[cut + 1 :])
    if len(options) not in (2, 4) or options[0] != "--exit-file" or not all(options[1::2]):
        raise ValueError("expected '--exit-file PATH [--spec PATH]' before '--'")
    if len(options) == 4 and options[2] != "--spec":
        raise ValueError(f"unknown option {options[2]!r}")
    if not command:
        raise ValueError("no command after '--'")
    return Path(options[1]), Path(options[3]) if len(options) == 4 else None, command


def permission_denied(program: str, filename: str | None, spec: CommandSpec) -> str:
    """What a refused start says: the file refused (a program found on CMD's PATH by its full path, and where a link
    leads), and, when CMD runs as another user, that it is that user who must reach it (a virtualenv's python often
    links to an interpreter in the server user's home, which other users cannot enter)."""
    where = filename or "not an executable file"
    if filename == program and os.sep not in program:
        where = shutil.which(program, path=(spec.env if spec.env is not None else os.environ).get("PATH")) or where
    if os.path.isabs(where) and os.path.realpath(where) != where:
        where = f"{where} -> {os.path.realpath(where)}"
    text = f"permission denied ({where})"
    if spec.uid is not None and spec.uid != os.geteuid():
        try:
            user = pwd.getpwuid(spec.uid).pw_name
        except KeyError:
            user = f"uid {spec.uid}"
        text += (
            f"; the workload runs as user {user}, who must be able to reach the program, every directory above it "
            "and the working directory (tessera up --run-as server runs workloads as the server's user)"
        )
    return text


def run_command(command: list[str], relay: _SignalRelay, spec: CommandSpec | None = None) -> int:
    """Runs CMD to its end; its exit code (negative: killed by that signal; 127/126: could not be started)."""
    if relay.first_signal is not None:  # told to stop before CMD started: do not start it
        return -relay.first_signal
    spec = spec or CommandSpec()
    try:
        # Inherits stdin/stdout/stderr and the process group; the rest as the spec says. The OOM killer takes the
        # command before the supervisor, which shares its memory limit (``oom_score``).
        with oom_score.spared():
            child = subprocess.Popen(
                command,
                env=spec.env,
                cwd=spec.cwd,
                user=spec.uid,
                group=spec.gid,
                extra_groups=spec.groups,
                umask=-1 if spec.umask is None else spec.umask,
            )
    except FileNotFoundError as error:
        missing = "command not found" if error.filename in (None, command[0]) else f"{error.filename} not found"
        logger.error("cannot run %r: %s", command[0], missing)
        return EXIT_NOT_FOUND
    except PermissionError as error:
        logger.error("cannot run %r: %s", command[0], permission_denied(command[0], error.filename, spec))
        return EXIT_CANNOT_EXECUTE
    except OSError as error:
        logger.error("cannot run %r: %s", command[0], error.strerror or error)
        return EXIT_CANNOT_EXECUTE
    relay.child_started(child.pid)
    code = wait_reaping(child.pid)
    child.returncode = code  # waited for here, not by Popen
    return code


def enter_network(spec: CommandSpec) -> int:
    """0, or 126 when the spec asks for a private network namespace and none can be made: CMD is then not started
    (it would run reachable by everyone on the host's loopback)."""
    if not spec.private_network:
        return 0
    from tessera.backends import netns  # here: only a replica's supervisor needs it (ctypes, socket, fcntl)

    try:
        netns.enter_private_network()
    except OSError as error:
        logger.error("cannot give the command a network of its own: %s", error)
        return EXIT_CANNOT_EXECUTE
    return 0


def wait_reaping(pid: int) -> int:
    """Waits for ``pid`` and returns its exit code, reaping meanwhile the orphans a subreaper inherits."""
    while True:
        ended, status = os.waitpid(-1, 0)  # a relayed signal interrupts the wait, which then resumes (PEP 475)
        if ended == pid:
            return os.waitstatus_to_exitcode(status)


def write_exit_code(exit_file: Path, exit_code: int) -> None:
    """Writes ``exit_code`` so that a reader sees either no file or the whole code, never a partial one."""
    temporary = exit_file.with_name(f"{exit_file.name}.{os.getpid()}.tmp")
    with open(temporary, "w") as handle:
        handle.write(f"{exit_code}\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, exit_file)


def end_workload(cgroup: Path | None, cgroup_kind: str | None) -> None:
    """SIGKILLs whatever is left of the workload, the supervisor included (so this does not return when it leads
    its group): the cgroup's members, then its descendants (the subreaper's tree), then the group."""
    sys.stdout.flush()
    sys.stderr.flush()
    if cgroup is not None and cgroup_kind is not None:
        try:
            if cgroup_kind == "cgroup2":
                cgroups.kill(cgroup_kind, cgroup)  # every member at once, this one included
            else:
                cgroups.kill(cgroup_kind, cgroup, spare=os.getpid())
        except OSError as error:
            logger.warning("cannot kill the rest of cgroup %s: %s", cgroup, error)
    left = reaper.kill_descendants()
    if left:
        logger.warning("processes %s survived SIGKILL", left)
    end_process_group()


def end_process_group() -> None:
    """SIGKILLs every process left in the supervisor's group, the supervisor included (so this does not return)."""
    sys.stdout.flush()
    sys.stderr.flush()
    if leads_own_group():
        os.killpg(os.getpgrp(), signal.SIGKILL)
    logger.warning("not leading a process group: processes that the command left behind are not killed")


def join_cgroups(spec: CommandSpec) -> tuple[Path | None, int]:
    """Joins the workload's cgroups: (the one that contains it, None: none, or it could not be joined; 0, or 126
    when one of its limit cgroups could not be joined: CMD is then not started, as its limits would not hold while
    its ``started`` event says they do)."""
    exit_code = 0
    for path in spec.limit_cgroups:
        try:
            cgroups.join(Path(path))
        except OSError as error:
            why = error.strerror or error
            logger.error("cannot join cgroup %s (%s): its limits would not hold; the command is not started", path, why)
            exit_code = EXIT_CANNOT_EXECUTE
            break
    if spec.cgroup is None:
        return None, exit_code
    try:
        cgroups.join(Path(spec.cgroup))
    except OSError as error:
        logger.warning("cannot join cgroup %s (%s); containing by subreaper only", spec.cgroup, error)
        return None, exit_code
    return Path(spec.cgroup), exit_code


def start_log_pipe(spec: CommandSpec) -> tuple[LogPipe | None, int]:
    """CMD's output through a pipe to the log under its cap (the supervisor's stdout is the log, open): (the pipe,
    None without a log in the spec; 0, or 126 when it cannot be set up: CMD is then not started, as it would write
    the log uncapped)."""
    if spec.log is None:
        return None, 0
    try:
        pipe = LogPipe(Path(spec.log), spec.log_max_bytes, sys.stdout.fileno())
        pipe.start()
    except (OSError, RuntimeError) as error:  # RuntimeError: no thread (the workload's pids limit, the host's)
        why = getattr(error, "strerror", None) or error
        logger.error("cannot cap the log %s (%s): the command is not started", spec.log, why)
        return None, EXIT_CANNOT_EXECUTE
    return pipe, 0


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="tessera-supervisor: %(message)s", stream=sys.stderr)
    relay = _SignalRelay()
    relay.install()  # a stop that comes while the rest is set up is kept, and CMD then not started
    # The backend starts this program with the stop signals blocked, so that one sent before the handlers were in
    # place waits (pending) instead of killing it before it could write an exit code: it arrives now.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, RELAYED_SIGNALS)
    try:
        exit_file, spec_file, command = split_args(sys.argv[1:] if argv is None else argv)
        spec = read_spec(spec_file) if spec_file is not None else CommandSpec()
    except (ValueError, TypeError, OSError) as error:
        logger.error("%s\n%s", error, USAGE)
        return 2
    if not reaper.become_subreaper():
        logger.warning("cannot become a child subreaper: what leaves the process group may outlive the command")
    cgroup, exit_code = join_cgroups(spec)
    relay.cgroup = cgroup
    pipe = None
    if exit_code == 0:  # each step fails closed: CMD never runs with less than it was told it has
        pipe, exit_code = start_log_pipe(spec)
    if exit_code == 0:
        exit_code = enter_network(spec)
    memory = [Path(p) for p in (*spec.limit_cgroups, *([spec.cgroup] if spec.cgroup else []))]
    kills_before = oom_score.oom_kills(memory)
    if exit_code == 0:
        exit_code = run_command(command, relay, spec)
    if exit_code < 0:
        kills = oom_score.oom_kills(memory) - kills_before if exit_code == -signal.SIGKILL else 0
        why = f": out of memory (the kernel killed {kills} process(es) of the workload at its memory limit)"
        logger.info("%r was ended by signal %s%s", command[0], signal_name(-exit_code), why if kills > 0 else "")
    if pipe is not None:
        pipe.finish()
    try:
        write_exit_code(exit_file, exit_code)
    except OSError as error:
        logger.error("cannot write the exit code %d to %s: %s", exit_code, exit_file, error)
    end_workload(cgroup, spec.cgroup_kind)
    return exit_code if exit_code >= 0 else 128 - exit_code  # reached only when not leading a process group


if __name__ == "__main__":
    sys.exit(main())
