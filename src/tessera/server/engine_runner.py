"""Which Python interpreter runs a replica's engine shim (``serving.engine_exec``) and Tessera's own sim engine.

As root, ``tessera up`` runs each tenant's workloads as the tenant's own OS user (``backends.accounts``), and a
replica is one. The server's own interpreter is often out of those users' reach: a virtualenv's ``python`` links to
an interpreter under ``/root`` (pyenv, conda, a clone in root's home), a 0700 directory. ``EngineRunner`` finds, once,
an interpreter that an unprivileged user can run with this Tessera and its dependencies importable:

1. ``TESSERA_ENGINE_RUNNER_PYTHON`` when set (the operator's choice, checked like the others);
2. the server's own interpreter;
3. another interpreter of the same version on the system's ``PATH`` (e.g. Debian's ``/usr/bin/python3.11`` beside a
   pyenv build), with the server's package directories on its ``PYTHONPATH`` (compiled packages are built for the
   version, not for one build of it).

Each candidate is tried by running it as ``nobody`` (no group, no home: what any tenant's user can do, it can) to
import the sim engine. If none passes, ``python`` raises ``RunnerUnreachable`` naming what was tried and why it
failed: a model's replicas then fail at once, saying so, instead of never answering; the search is made again
after ``RETRY_S`` (a probe may fail for a passing reason, a host out of processes). Servers that run workloads as
their own user need no check.
"""

from __future__ import annotations

import logging
import math
import os
import pwd
import site
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from tessera.backends.accounts import DEFAULT_PATH, LANG
from tessera.errors import TesseraError

log = logging.getLogger(__name__)

RUNNER_PYTHON_ENV = "TESSERA_ENGINE_RUNNER_PYTHON"
PROBE_MODULE = "tessera.serving.engines.sim_server"
PROBE_TIMEOUT_S = 120.0
UNPRIVILEGED_USER = "nobody"
RETRY_S = 60.0  # a search that found none is made again after this long (a probe may fail on a host out of processes)


class RunnerUnreachable(TesseraError):
    """No interpreter that tenants' users can run imports Tessera here."""


def package_path(environ: Mapping[str, str] = os.environ) -> list[str]:
    """This Tessera's source root, the server's ``PYTHONPATH`` and its site-packages: what a replica's
    ``PYTHONPATH`` holds, so that another interpreter of the same version finds the same packages. Never the
    server's working directory, nor a directory other users may write to (a tenant could plant a module there)."""
    root = str(Path(__file__).resolve().parents[2])
    given = [p for p in environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    found = [root]
    for entry in [*given, *site.getsitepackages()]:
        entry = os.path.abspath(entry)
        if entry not in found and os.path.isdir(entry) and not os.stat(entry).st_mode & stat.S_IWOTH:
            found.append(entry)
    return found


def candidates(env_choice: str | None, version: Sequence[int] = sys.version_info[:2]) -> list[str]:
    """The interpreters to try, in order (see the module docstring); duplicates removed."""
    same = f"python{version[0]}.{version[1]}"
    found = [*([env_choice] if env_choice else []), sys.executable]
    found += [
        path for folder in DEFAULT_PATH.split(os.pathsep) if os.access(path := os.path.join(folder, same), os.X_OK)
    ]
    return list(dict.fromkeys(found))


class EngineRunner:
    """The interpreter a replica's shim runs with (``python``), found once and then remembered; thread-safe.
    ``check_unprivileged``: the workloads run as other users than the server's (root's tenant users)."""

    def __init__(self, check_unprivileged: bool, tried: Sequence[str] | None = None) -> None:
        self.check_unprivileged = check_unprivileged
        self.tried = tried  # the interpreters to try; None: ``candidates`` (see the module docstring)
        self.path = package_path()
        self._lock = threading.Lock()
        self._found: str | None = None
        self._failure: str | None = None
        self._failed_at = -math.inf  # time.monotonic() of the last search that found none

    def python(self) -> str:
        if not self.check_unprivileged:
            return sys.executable
        with self._lock:
            if self._found is None and time.monotonic() - self._failed_at >= RETRY_S:
                self._find()
            if self._found is None:
                raise RunnerUnreachable(self._failure or "no interpreter")
            return self._found

    def _find(self) -> None:
        reasons = []
        tried = self.tried if self.tried is not None else candidates(os.environ.get(RUNNER_PYTHON_ENV))
        for python in tried:
            problem = self._probe(python)
            if problem is None:
                if python != sys.executable:
                    log.info("replicas' engine shim runs with %s (tenants cannot run %s)", python, sys.executable)
                self._found = python
                return
            reasons.append(f"{python}: {problem}")
        self._failure = (
            f"no Python interpreter that tenants' OS users may run can import Tessera here ({'; '.join(reasons)}); "
            f"install Tessera where other users can read it, set {RUNNER_PYTHON_ENV} to such an interpreter, or "
            "run tessera up --run-as server"
        )
        self._failed_at = time.monotonic()
        log.error("%s", self._failure)

    def _probe(self, python: str) -> str | None:
        """None when ``python``, run as an unprivileged user, imports the sim engine; else why not (one line)."""
        try:
            nobody = pwd.getpwnam(UNPRIVILEGED_USER)
        except KeyError:
            return f"no user {UNPRIVILEGED_USER!r} to try it as"
        env = {"PATH": DEFAULT_PATH, "LANG": LANG, "PYTHONPATH": os.pathsep.join(self.path)}
        try:
            done = subprocess.run(
                [python, "-c", f"import {PROBE_MODULE}"], env=env, cwd="/", capture_output=True, text=True,
                timeout=PROBE_TIMEOUT_S, user=nobody.pw_uid, group=nobody.pw_gid, extra_groups=[], check=False,
            )  # fmt: skip
        except (OSError, subprocess.SubprocessError) as exc:
            return str(exc)
        if done.returncode == 0:
            return None
        lines = done.stderr.strip().splitlines()
        return lines[-1] if lines else f"exit code {done.returncode}"
