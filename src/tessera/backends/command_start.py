"""Starting a workload's command (CMD, or one rank of a gang) as the supervisor's child, and what a refused start
says in the log: ``start_command`` gives the process, or the exit code of a command that could not be started (127:
not found, 126: could not be run), the reason in one line of the log.

Imports only the standard library, ``command_spec`` and ``oom_score`` (the supervisor's).
"""

from __future__ import annotations

import logging
import os
import pwd
import shutil
import subprocess
from collections.abc import Mapping

from tessera.backends import oom_score
from tessera.backends.command_spec import CommandSpec

# Not __name__: what the supervisor says is said under its name, wherever it comes from.
logger = logging.getLogger("tessera.backends.supervisor")

EXIT_CANNOT_EXECUTE = 126
EXIT_NOT_FOUND = 127


def start_command(
    command: list[str], spec: CommandSpec, env: Mapping[str, str] | None = None, output_fd: int | None = None
) -> subprocess.Popen[bytes] | int:
    """Starts ``command`` as the spec says (user, groups, directory, umask; environment ``env``, else the spec's),
    in the supervisor's process group, the OOM killer's choice before the supervisor, which shares its memory limit
    (``oom_score``). Its stdout and stderr: ``output_fd``, else the supervisor's own (inherited). Returns the
    process, or 127/126 when it could not be started (the reason logged)."""
    try:
        with oom_score.spared():
            return subprocess.Popen(
                command,
                env=spec.env if env is None else env,
                cwd=spec.cwd,
                user=spec.uid,
                group=spec.gid,
                extra_groups=spec.groups,
                umask=-1 if spec.umask is None else spec.umask,
                stdout=output_fd,
                stderr=output_fd,
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
