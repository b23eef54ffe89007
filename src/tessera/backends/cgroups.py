"""One cgroup per workload, so that ending a workload ends every process it started, also those that left its process
group (``setsid``, a double fork, ``nohup``) and those whose supervisor was killed with SIGKILL.

A process cannot leave its cgroup without write access to another cgroup's ``cgroup.procs`` (root's files), so the
cgroup names the workload's processes whatever they do. Kinds, best first (``detect("auto", ...)``):

- ``cgroup2``: a cgroup v2 hierarchy whose cgroups have ``cgroup.kill`` (Linux 5.14+): one write kills every member
  at once, new forks included;
- ``freezer``: a cgroup v1 freezer hierarchy: freeze (no process can fork any more), SIGKILL every member, thaw;
- ``pids``: a cgroup v1 pids hierarchy: SIGKILL every member, again until none is left (a fork between a read and
  the kills is caught by the next round).

None is usable without root (or a delegated subtree): the local backend then relies on the supervisor as a child
subreaper (``reaper.py``), which cannot catch what outlives a SIGKILLed supervisor. Workload cgroups live under
``<the server's own cgroup>/tessera-<hash of the run dir>/<workload>``, so that two servers never share one.

Imports only the standard library: the supervisor (``python -s -P -m``) uses it too, before anything else loads.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from tessera.backends import procfs

KINDS = ("cgroup2", "freezer", "pids")
MOUNTS = Path("/proc/self/mounts")
OWN_CGROUPS = Path("/proc/self/cgroup")
KILL_TIMEOUT_S = 5.0


class CgroupError(OSError):
    """A cgroup kind asked for by name is not usable here (the message says why)."""


@dataclass(frozen=True, slots=True)
class CgroupTree:
    """The directory under which this server makes its workloads' cgroups, and how they are killed."""

    kind: str  # one of KINDS; for the limits in a cgroup v1 hierarchy (cgroup_limits), its controller
    root: Path  # .../tessera-<hash>

    def path(self, name: str) -> Path:
        """The cgroup of the workload whose file stem is ``name`` (it may not exist)."""
        return self.root / name

    def create(self, name: str) -> Path:
        """Makes the workload's cgroup, emptied of any process left from an earlier run of the same workload."""
        path = self.path(name)
        for _ in range(3):  # another backend of this run dir may close (remove) the then empty root in between
            with contextlib.suppress(FileExistsError):  # (not mkdir's exist_ok: it fails if removed right after)
                self.root.mkdir()
            try:
                path.mkdir()
            except FileNotFoundError:
                continue
            except FileExistsError:
                kill(self.kind, path)
            return path
        raise CgroupError(errno.ENOENT, f"cannot make cgroup {path}")

    def remove(self, path: Path) -> bool:
        """Removes an empty cgroup (the server's directory stays until ``close``: removing it with its last cgroup
        raced with a launch making the next); False while processes are still in it."""
        try:
            path.rmdir()
        except FileNotFoundError:
            pass
        except OSError as error:
            if error.errno in (errno.EBUSY, errno.ENOTEMPTY):
                return False
            raise
        return True

    def close(self) -> None:
        """Removes the server's directory when no workload cgroup is left in it (else keeps it: they still run)."""
        with contextlib.suppress(OSError):
            self.root.rmdir()


def tree_name(run_dir: Path) -> str:
    import hashlib  # here: the supervisor imports this module and should start fast

    return "tessera-" + hashlib.sha256(str(run_dir.resolve()).encode()).hexdigest()[:12]


def detect(kind: str, run_dir: Path) -> CgroupTree | None:
    """The usable tree of ``kind`` ("auto": the best usable; "none": None). ``CgroupError`` when a kind named
    explicitly is not usable; "auto" returns None when none is."""
    if kind == "none":
        return None
    if kind != "auto" and kind not in KINDS:
        raise CgroupError(errno.EINVAL, f"unknown containment {kind!r} (auto, none, {', '.join(KINDS)})")
    reasons = []
    for candidate in KINDS if kind == "auto" else (kind,):
        try:
            return usable_tree(candidate, run_dir)
        except OSError as error:
            reasons.append(f"{candidate}: {error.strerror or error}")
    if kind == "auto":
        return None
    raise CgroupError(errno.ENOTSUP, "; ".join(reasons))


def usable_tree(kind: str, run_dir: Path, needed: str | None = None) -> CgroupTree:
    """The tree of this server's cgroups in the hierarchy of ``kind`` (a containment kind of ``KINDS``, or any
    controller mounted as cgroup v1: ``cgroup_limits``), if a cgroup made there has the file ``needed`` (by default
    what containment of ``kind`` needs); ``OSError`` (``CgroupError``) when not."""
    mount = mount_point(kind)
    if mount is None:
        raise CgroupError(errno.ENOENT, "not mounted")
    root = mount / own_path(kind).lstrip("/") / tree_name(run_dir)
    root.mkdir(exist_ok=True)
    probe = root / f"probe-{os.getpid()}"
    probe.mkdir(exist_ok=True)
    try:
        needed = needed or {"cgroup2": "cgroup.kill", "freezer": "freezer.state", "pids": "cgroup.procs"}[kind]
        if not (probe / needed).exists():
            raise CgroupError(errno.ENOTSUP, f"no {needed} in its cgroups")
    finally:
        probe.rmdir()
        with contextlib.suppress(OSError):
            root.rmdir()  # made again by the first workload
    return CgroupTree(kind, root)


def mount_point(kind: str) -> Path | None:
    """Where the hierarchy of ``kind`` is mounted (the first such mount), or None."""
    for line in MOUNTS.read_text().splitlines():
        fields = line.split()
        if len(fields) < 4:
            continue
        fstype, options = fields[2], fields[3].split(",")
        if (kind == "cgroup2" and fstype == "cgroup2") or (fstype == "cgroup" and kind in options):
            return Path(fields[1].replace("\\040", " "))
    return None


def own_path(kind: str) -> str:
    """This process's cgroup in the hierarchy of ``kind`` ("/" when it is not listed)."""
    for line in OWN_CGROUPS.read_text().splitlines():
        number, controllers, path = line.split(":", 2)
        if (kind == "cgroup2" and number == "0") or kind in controllers.split(","):
            return path
    return "/"


def join(path: Path) -> None:
    """Moves the calling process into the cgroup at ``path`` (its children are born there)."""
    (path / "cgroup.procs").write_text(f"{os.getpid()}\n")


def members(path: Path) -> list[int]:
    """The live processes in the cgroup (none when it does not exist); zombies, which have ended but may be listed
    until their parent reaps them, are left out."""
    try:
        text = (path / "cgroup.procs").read_text()
    except FileNotFoundError:
        return []
    return [pid for pid in map(int, text.split()) if procfs.is_alive(pid)]


def signal_members(path: Path, signum: int, spare: int | None = None, spare_group: int | None = None) -> None:
    """Sends ``signum`` to every process of the cgroup but ``spare`` and the members of process group
    ``spare_group`` (signalled already through their group: each process gets a stop signal once)."""
    for pid in members(path):
        if pid != spare:
            with contextlib.suppress(ProcessLookupError):
                if spare_group is None or os.getpgid(pid) != spare_group:
                    os.kill(pid, signum)


def kill(kind: str, path: Path, spare: int | None = None, timeout_s: float = KILL_TIMEOUT_S) -> list[int]:
    """SIGKILLs every process of the cgroup but ``spare`` (the caller, when it is a member: then nothing is frozen),
    again until none is left or ``timeout_s`` has passed (0: one round); returns those still there (a killed process
    leaves the cgroup once it has ended)."""
    if not path.exists():
        return []
    deadline_s = time.monotonic() + timeout_s
    while True:
        if kind == "cgroup2" and spare is None:
            (path / "cgroup.kill").write_text("1\n")
        elif kind == "freezer" and spare is None:
            _freeze_and_kill(path)
        else:
            signal_members(path, signal.SIGKILL, spare)
        left = [pid for pid in members(path) if pid != spare]
        if not left or time.monotonic() >= deadline_s:
            return left
        time.sleep(0.01)


def _freeze_and_kill(path: Path) -> None:
    state = path / "freezer.state"
    state.write_text("FROZEN\n")
    deadline_s = time.monotonic() + 1.0
    while state.read_text().strip() != "FROZEN" and time.monotonic() < deadline_s:
        time.sleep(0.005)
    signal_members(path, signal.SIGKILL)
    state.write_text("THAWED\n")  # SIGKILL takes effect as they thaw
