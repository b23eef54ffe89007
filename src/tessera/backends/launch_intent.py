"""Launch intents: what the local backend records *before* it starts a workload's supervisor, and how a restarted
server finds that supervisor again by what it is, when the server died before it could record the process.

Why: ``LocalBackend.launch`` learns the supervisor's pid only once it has started, so a ``kill -9`` of the server
between the fork and the write of the reference file (``<id>.ref.json``) left a running workload that nothing
pointed to, and the restarted server launched it a second time (issue 17). Now ``launch``

1. removes the old exit file, then writes ``<id>.intent.json`` (this ``Intent``: the exit file and a fresh nonce),
2. starts the supervisor with ``--exit-file <exit file>`` on its command line and the nonce in its environment
   (``NONCE_ENV``),
3. writes the reference file,

and ``poll`` removes both files once it has reported the end. So a restarted server that finds an intent without a
reference file knows a launch was begun, and ``find_supervisor`` looks for it in ``/proc``: a live session leader
whose command line runs the supervisor module with ``--exit-file`` naming this workload's exit file, and whose
environment carries the intent's nonce (a process that merely copies the command line, as any user can read it, is
not taken for the workload). If none lives but the exit file exists, the workload ran and ended: the exit file was
removed before the intent was written, so it cannot be an earlier run's. If neither, the launch never got as far as
starting the supervisor, and the workload may be launched.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from tessera.backends import procfs

logger = logging.getLogger(__name__)

NONCE_ENV = "TESSERA_LAUNCH_NONCE"  # in the supervisor's environment: which launch started it


@dataclass(frozen=True, slots=True)
class Intent:
    """A launch that was begun: whose, which exit file its supervisor writes, and a nonce naming this launch."""

    workload_id: str
    exit_file: str
    nonce: str

    @classmethod
    def new(cls, workload_id: str, exit_file: Path) -> Intent:
        return cls(workload_id, str(exit_file), secrets.token_hex(16))

    def to_json(self) -> dict[str, str]:
        return {"workload_id": self.workload_id, "exit_file": self.exit_file, "nonce": self.nonce}


def write_intent(path: Path, intent: Intent) -> None:
    """Writes ``intent`` whole (a temporary file renamed into place) before the fork. Not fsync'd: the crash this
    guards against is the server's (``kill -9``), after which the kernel still writes the file; a crash of the host
    takes the workload's processes with it, and one fsync per launch would slow a wave of launches."""
    temporary = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    temporary.write_text(json.dumps(intent.to_json()) + "\n")
    os.replace(temporary, path)


def read_intent(path: Path) -> Intent | None:
    """The intent recorded at ``path``; None when there is none (or it is malformed: logged)."""
    try:
        value = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except ValueError as error:
        logger.warning("%s does not hold a launch intent: %s", path, error)
        return None
    fields = [value.get(key) for key in ("workload_id", "exit_file", "nonce")] if isinstance(value, dict) else []
    strings = [field for field in fields if isinstance(field, str) and field]
    if len(strings) != 3:
        logger.warning("%s does not hold a launch intent: %r", path, value)
        return None
    return Intent(*strings)


def names_exit_file(argv: list[str], module: str, exit_file: str) -> bool:
    """True if ``argv`` runs ``module`` with ``--exit-file exit_file``, both before the ``--`` that starts the
    workload's own command (so a workload whose arguments merely mention the exit file does not match)."""
    options = argv[: argv.index("--")] if "--" in argv else argv
    if module not in options:
        return False
    return any(options[i] == "--exit-file" and options[i + 1] == exit_file for i in range(len(options) - 1))


def find_supervisor(intent: Intent, module: str) -> procfs.ProcStat | None:
    """The live supervisor that the launch of ``intent`` started, or None (one scan of ``/proc``)."""
    for pid in procfs.all_pids():
        argv = procfs.read_cmdline(pid)
        if argv is None or not names_exit_file(argv, module, intent.exit_file):
            continue
        stat = procfs.read_proc_stat(pid)
        if stat is None or procfs.is_gone(stat) or stat.pgid != pid:  # ours leads its own process group
            continue
        try:
            environ = procfs.read_environ(pid)
        except PermissionError:
            logger.warning("%s: cannot read the environment of pid %d to check its launch", intent.workload_id, pid)
            continue
        if environ is not None and environ.get(NONCE_ENV) == intent.nonce:
            return stat
        logger.warning("%s: pid %d runs like its supervisor but is not its launch", intent.workload_id, pid)
    return None


def find_launched(path: Path, workload_id: str, module: str) -> tuple[int, int, str, str] | None:
    """What the launch recorded at ``path`` left: (pid, pgid, start marker, exit file) of its live supervisor, or
    (0, 0, "", exit file) when only the exit file is left (it ran and ended); None if no launch of ``workload_id``
    was recorded there, or if it never started the supervisor."""
    intent = read_intent(path)
    if intent is None or intent.workload_id != workload_id:
        return None
    found = find_supervisor(intent, module)
    if found is not None:
        logger.warning("%s: found its supervisor, pid %d, without a reference file", workload_id, found.pid)
        return found.pid, found.pgid, found.start_marker, intent.exit_file
    if Path(intent.exit_file).exists():  # removed before the intent was written: this launch's end
        logger.warning("%s: it ran and ended while no server recorded its process", workload_id)
        return 0, 0, "", intent.exit_file
    return None
