"""Each workload's private runtime directory (``TESSERA_RUNTIME_DIR``): a place only its own OS user can enter,
made fresh at every launch and removed when the workload ends, like systemd's ``RuntimeDirectory``; their base goes
when the backend closes with no workload's directory left in it.

What it is for: a model replica listens on a Unix socket there (``engine.sock``), so that no other tenant can
connect to it, bind its address first or replace it: the directory is 0700 and owned by the workload's user, and
its parent (``RuntimeDirs.base``) belongs to the server, which alone creates entries in it. The server (root, or the
one user every workload runs as) reaches every socket; the gateway then also checks who listens (``SO_PEERCRED``).

Where: a root server uses ``/run/tessera/<digest>`` (``/run`` is root's, nobody else can plant anything on the
way); any other server ``$XDG_RUNTIME_DIR/tessera/<digest>`` or ``/tmp/tessera-<uid>/<digest>``, each directory
checked to be its own and private (``/tmp`` is everybody's: a directory someone else made first is refused). The
digest names the server's run directory, so two servers on one host never share one, and paths stay short (a Unix
socket's path has at most 107 bytes). It is meant for sockets and small files: ``/run`` is a memory-backed tmpfs,
what a workload writes there counts against its memory limit, and it goes with the workload.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import stat
from pathlib import Path

logger = logging.getLogger(__name__)

RUNTIME_DIR_ENV = "TESSERA_RUNTIME_DIR"
SOCKET_PATH_MAX = 107  # sun_path holds 108 bytes, the last one a NUL
LONGEST_NAME = len("/999999999/engine.sock")  # what goes below the base: a workload's directory and a socket


class RuntimeDirError(OSError):
    """No safe runtime directory could be made."""


class RuntimeDirs:
    """The runtime directories of one server's workloads, below ``base`` (see the module docstring)."""

    def __init__(self, base: Path) -> None:
        self.base = base

    def path(self, stem: str) -> Path:
        return self.base / stem

    def make(self, stem: str, uid: int, gid: int) -> Path:
        """A new, empty directory for the workload ``stem`` (what an earlier run of it left is removed first),
        0700 and owned by ``uid``:``gid``."""
        path = self.path(stem)
        self.remove(stem)
        try:
            os.mkdir(path, 0o700)
        except FileNotFoundError:  # another backend of this run dir found the base empty at its close
            _own_base(self.base)
            os.mkdir(path, 0o700)
        try:
            if (uid, gid) != (os.geteuid(), os.getegid()):
                os.chown(path, uid, gid)
            os.chmod(path, 0o700)
        except BaseException:
            os.rmdir(path)
            raise
        return path

    def remove(self, stem: str) -> None:
        """Removes the workload's directory and what its user put there. ``shutil.rmtree`` never follows a
        symbolic link the workload left inside: it removes the link."""
        path = self.path(stem)
        try:
            info = path.lstat()
        except FileNotFoundError:
            return
        if stat.S_ISDIR(info.st_mode):
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
        if path.exists():
            logger.warning("cannot remove the runtime directory %s", path)

    def close(self) -> None:
        """Removes the base if no workload's directory is left in it (one that still runs keeps it)."""
        with contextlib.suppress(OSError):
            self.base.rmdir()


def base_candidates(run_dir: Path) -> list[Path]:
    """Where the base of the runtime directories of the server whose run directory is ``run_dir`` may be, in order
    of preference (see the module docstring)."""
    digest = hashlib.sha256(str(run_dir.absolute()).encode()).hexdigest()[:12]
    uid = os.geteuid()
    if uid == 0:
        return [Path("/run/tessera") / digest]
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    return [parent / digest for parent in ([Path(xdg) / "tessera"] if xdg else []) + [Path(f"/tmp/tessera-{uid}")]]


def base_path(run_dir: Path) -> Path:
    """The first of ``base_candidates`` (a root server's only one)."""
    return base_candidates(run_dir)[0]


def runtime_base(run_dir: Path) -> Path:
    """The private base of this server's runtime directories (made if missing; ``RuntimeDirError`` when no safe one
    can be)."""
    reasons = []
    for base in base_candidates(run_dir):
        if len(str(base)) + LONGEST_NAME > SOCKET_PATH_MAX:
            reasons.append(f"{base}: too long a path for a Unix socket")
            continue
        try:
            _own_base(base)
        except OSError as exc:
            reasons.append(f"{base}: {exc.strerror or exc}")
            continue
        return base
    raise RuntimeDirError("no private runtime directory could be made (" + "; ".join(reasons) + ")")


def _own_base(base: Path) -> None:
    _own_directory(base.parent, 0o711 if os.geteuid() == 0 else 0o700)
    _own_directory(base, 0o711)


def _own_directory(path: Path, mode: int) -> None:
    """``path`` exists as a real directory of this user with ``mode`` (made so if missing); refuses one that is a
    link or somebody else's."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, mode)
    info = path.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
        raise RuntimeDirError(f"{path} is not a directory of this user's")
    if stat.S_IMODE(info.st_mode) != mode:
        os.chmod(path, mode)
