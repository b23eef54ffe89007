"""The small program the local backend puts between the server and a workload's command.

``LocalBackend.launch`` runs ``python -s -P -m tessera.backends.supervisor --exit-file PATH [--spec PATH] -- CMD
ARGS...`` in a new session, with an environment of its own (never the tenant's: no ``PYTHONPATH``, ``PYTHONHOME`` or
``LD_PRELOAD`` of theirs reaches this program, and ``-P`` keeps the working directory off ``sys.path``), so the
supervisor leads the workload's process group and outlives a server killed with ``kill -9``; its stdout and stderr
go to the workload's log (opened by the server). The supervisor

1. reads and deletes the spec file (``command_spec.CommandSpec``: CMD's environment, directory, user, umask, cgroups,
   log and gang),
   makes itself a child subreaper (``reaper.py``) and moves itself into the workload's cgroups (``cgroups.py``: the
   one that contains it, and those of its limits in cgroup v1 hierarchies) if any;
2. starts CMD as its child (``command_start.py``), in the same process group (as the tenant's user when the spec
   names one), its stdout and stderr a pipe whose bytes a thread of the supervisor writes to the log under the log's
   cap (``log_pipe.py``; without a log in the spec, CMD inherits the supervisor's stdout and stderr), the OOM
   killer's choice before the supervisor (``oom_score.py``); with a gang in the spec, one CMD per rank, each with
   torchrun's variables and a log of its own, the first rank that fails stopping the others (``gang_ranks.py``);
3. relays SIGTERM and SIGINT to the whole workload (the group, and the cgroup's members or its descendants: what
   left the group too), once per signal it receives (``signal_relay.py``);
4. waits for CMD (reaping orphans meanwhile), says so if the OOM killer ended it, copies the rest of its output,
   and writes CMD's exit code to the exit file atomically (temporary file, then ``os.replace``): the code CMD
   exited with, minus N if a signal N killed it, 127 if CMD was not found, 126 if it could not be run (a gang's:
   its first failure's, 0 when every rank exited 0);
5. kills what is left of the workload with SIGKILL (the cgroup, its descendants, the group), itself last, so nothing
   of the workload outlives CMD.

If a stop signal arrives before CMD started, CMD is not started and the exit code is minus that signal. Nor is it
(exit code 126, the reason in one line of the log) when the supervisor cannot give it all it was told it has: a
limit cgroup it cannot join, a log pipe it cannot set up (no thread: the host out of PIDs), a private network it
cannot make, a rank's log it cannot open, a master port it cannot pick.
Imports only the standard library (and Tessera's modules that do too). Linux (POSIX process groups) only.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from tessera.backends import cgroups, oom_score, reaper
from tessera.backends.command_spec import CommandSpec, read_spec
from tessera.backends.command_start import EXIT_CANNOT_EXECUTE, EXIT_NOT_FOUND, permission_denied, start_command
from tessera.backends.gang_ranks import open_rank_logs, run_gang
from tessera.backends.log_pipe import LogPipe, finish_all
from tessera.backends.signal_relay import RELAYED_SIGNALS, SignalRelay, leads_own_group

# Not __name__: run with ``-m`` this module is "__main__".
logger = logging.getLogger("tessera.backends.supervisor")

__all__ = [
    "EXIT_CANNOT_EXECUTE",
    "EXIT_NOT_FOUND",
    "RELAYED_SIGNALS",
    "CommandSpec",
    "main",
    "permission_denied",
    "read_spec",
]
USAGE = "usage: python -m tessera.backends.supervisor --exit-file PATH [--spec PATH] -- CMD [ARGS...]"


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


def run_command(command: list[str], relay: SignalRelay, spec: CommandSpec | None = None) -> int:
    """Runs CMD to its end; its exit code (negative: killed by that signal; 127/126: could not be started)."""
    if relay.first_signal is not None:  # told to stop before CMD started: do not start it
        return -relay.first_signal
    spec = spec or CommandSpec()
    child = start_command(command, spec)  # inherits stdin/stdout/stderr and the process group
    if isinstance(child, int):
        return child
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
    relay = SignalRelay()
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
    pipe: LogPipe | None = None
    rank_pipes: dict[int, LogPipe] = {}
    if exit_code == 0:  # each step fails closed: CMD never runs with less than it was told it has
        pipe, exit_code = start_log_pipe(spec)
    if exit_code == 0:
        rank_pipes, exit_code = open_rank_logs(spec, pipe)
    if exit_code == 0:
        exit_code = enter_network(spec)
    memory = [Path(p) for p in (*spec.limit_cgroups, *([spec.cgroup] if spec.cgroup else []))]
    kills_before = oom_score.oom_kills(memory)
    if exit_code == 0 and spec.gang is not None:
        exit_code = run_gang(command, relay, spec, rank_pipes)
    elif exit_code == 0:
        exit_code = run_command(command, relay, spec)
    if exit_code < 0:
        kills = oom_score.oom_kills(memory) - kills_before if exit_code == -signal.SIGKILL else 0
        why = f": out of memory (the kernel killed {kills} process(es) of the workload at its memory limit)"
        logger.info("%r was ended by signal %s%s", command[0], signal_name(-exit_code), why if kills > 0 else "")
    finish_all([*([pipe] if pipe is not None else []), *rank_pipes.values()])
    try:
        write_exit_code(exit_file, exit_code)
    except OSError as error:
        logger.error("cannot write the exit code %d to %s: %s", exit_code, exit_file, error)
    end_workload(cgroup, spec.cgroup_kind)
    return exit_code if exit_code >= 0 else 128 - exit_code  # reached only when not leading a process group


if __name__ == "__main__":
    sys.exit(main())
