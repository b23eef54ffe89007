"""Resource limits of a workload's cgroup: how many processes and threads it may have (``pids``), how much memory
(``memory``) and how much CPU (``cpu``: a quota and a weight). The local backend sets them in ``LocalExec.prepare``,
before the supervisor joins the cgroups, so that the command and everything it starts is held to them.

Where each controller is, per controller (``detect``):

- **cgroup v2**, when the workload cgroups are in a v2 tree (``cgroups.CgroupTree`` of kind ``cgroup2``) and the
  controller can be enabled for them: it is listed in the server's cgroup's ``cgroup.controllers`` and written to its
  ``cgroup.subtree_control`` (root may; the kernel refuses ``memory`` while that cgroup holds processes of its own
  and is not the root: then run the server in a cgroup of its own, such as a container's). The limits are files of
  the workload's one cgroup.
- **cgroup v1**, when a v1 hierarchy of the controller is mounted (hybrid hosts, older ones): the workload gets a
  cgroup of its own there, ``<the server's cgroup in it>/tessera-<hash>/<workload>``, which the supervisor joins
  too, and which is removed with the workload's.
- **nowhere**: no cgroup (``tessera up`` not root, or containment ``none``): the limit is not enforced, and the
  server's log and each workload's ``started`` event say so.

Values: ``pids.max`` = ``Limits.pids_max``; ``memory.max`` (v1 ``memory.limit_in_bytes``, and the same for memory
plus swap where swap is accounted) = ``mem_max_mib``; a CPU quota of ``cpu_milli`` / 1000 CPUs per 100 ms period
(``cpu.max``, v1 ``cpu.cfs_quota_us``) and a weight in proportion (``cpu.weight`` 100 per CPU, v1 ``cpu.shares``
1024 per CPU); without ``cpu_milli``, no quota and the weight of one CPU. A workload joins every controller found,
limited or not: its processes then compete for CPU as one group, not each on its own.

Imports only the standard library (``cgroups`` is used by the supervisor; this module only by the server).
"""

from __future__ import annotations

import errno
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from tessera.backends import cgroups

logger = logging.getLogger(__name__)

CONTROLLERS = ("pids", "memory", "cpu")
CPU_PERIOD_US = 100_000
MIN_CPU_QUOTA_US = 1_000  # the kernel's least
_V1_PROBE = {"pids": "pids.max", "memory": "memory.limit_in_bytes", "cpu": "cpu.shares"}


@dataclass(frozen=True, slots=True)
class Limits:
    """What one workload is held to; 0 = no limit."""

    pids_max: int = 0  # processes and threads together
    mem_max_mib: int = 0
    cpu_milli: int = 0  # the CPU quota (1000 = one CPU) and the weight; 0: no quota, the weight of one CPU

    def describe(self) -> dict[str, str]:
        """Per controller, the limit in words."""
        return {
            "pids": f"{self.pids_max} processes" if self.pids_max else "no process limit",
            "memory": f"{self.mem_max_mib} MiB memory" if self.mem_max_mib else "no memory limit",
            "cpu": f"{self.cpu_milli / 1000:g} CPU quota" if self.cpu_milli else "no CPU quota (weight of one CPU)",
        }


@dataclass(frozen=True, slots=True)
class LimitPlaces:
    """Where each controller's limits go (see the module's doc)."""

    unified: frozenset[str] = frozenset()  # controllers set in the workload's cgroup v2 cgroup
    v1_roots: Mapping[str, Path] = field(default_factory=dict)  # controller -> its tessera-<hash> directory
    missing: Mapping[str, str] = field(default_factory=dict)  # controller -> why it is not enforced

    def describe(self) -> str:
        """For the server's log: which controller is where."""
        parts = [f"{c} (cgroup v2)" for c in CONTROLLERS if c in self.unified]
        parts += [f"{c} (cgroup v1)" for c in CONTROLLERS if c in self.v1_roots]
        text = "workload limits: " + (", ".join(parts) or "none")
        if self.missing:
            text += "; NOT enforced: " + "; ".join(f"{c} ({why})" for c, why in self.missing.items())
        return text

    def v1_dirs(self, stem: str, spare: Path | None = None) -> list[Path]:
        """The workload's v1 cgroups beside ``spare`` (its containment cgroup, joined anyway), in order."""
        return [tree.path(stem) for tree in self.v1_trees(stem, spare)]

    def v1_trees(self, stem: str, spare: Path | None = None) -> list[cgroups.CgroupTree]:
        """The trees of ``v1_dirs``, which make and remove the workload's cgroups in them."""
        trees = [cgroups.CgroupTree(controller, root) for controller, root in self.v1_roots.items()]
        roots = [tree.root for tree in trees]
        return [t for i, t in enumerate(trees) if t.path(stem) != spare and t.root not in roots[:i]]


def detect(tree: cgroups.CgroupTree | None, run_dir: Path) -> LimitPlaces:
    """Where this host lets the server set each controller's limits for the workloads of ``tree``."""
    if tree is None:
        return LimitPlaces(missing={c: "no cgroup for workloads" for c in CONTROLLERS})
    unified: set[str] = set()
    v1_roots: dict[str, Path] = {}
    missing: dict[str, str] = {}
    for controller in CONTROLLERS:
        why_not_v2 = _enable_v2(tree, controller) if tree.kind == "cgroup2" else "the workload cgroups are v1"
        if why_not_v2 is None:
            unified.add(controller)
            continue
        try:
            v1_roots[controller] = _usable_v1_root(controller, tree, run_dir)
        except OSError as error:
            missing[controller] = f"{why_not_v2}; cgroup v1: {error.strerror or error}"
    return LimitPlaces(frozenset(unified), v1_roots, missing)


def _enable_v2(tree: cgroups.CgroupTree, controller: str) -> str | None:
    """Enables ``controller`` for the children of the server's cgroup (the parent of ``tree.root``); None when it
    is, else why not."""
    parent = tree.root.parent
    try:
        if controller not in (parent / "cgroup.controllers").read_text().split():
            return "cgroup v2: not available to the server's cgroup"
        if controller not in (parent / "cgroup.subtree_control").read_text().split():
            (parent / "cgroup.subtree_control").write_text(f"+{controller}\n")
    except OSError as error:
        if error.errno == errno.EBUSY:
            return f"cgroup v2: {parent} holds processes of its own (give the server a cgroup of its own)"
        return f"cgroup v2: cannot enable it in {parent}: {error.strerror or error}"
    return None


def _usable_v1_root(controller: str, tree: cgroups.CgroupTree, run_dir: Path) -> Path:
    if tree.kind == controller:  # the containment tree itself (kind "pids")
        return tree.root
    return cgroups.usable_tree(controller, run_dir, needed=_V1_PROBE[controller]).root


def apply(places: LimitPlaces, tree: cgroups.CgroupTree, cgroup: Path, stem: str, limits: Limits) -> list[str]:
    """Sets ``limits`` on the workload's cgroups (``cgroup``, made by ``tree.create``, and its v1 ones, made here:
    ``OSError`` when one cannot be); returns the controllers whose limits could not be set (logged)."""
    failed = []
    if places.unified:
        try:
            _write(tree.root / "cgroup.subtree_control", " ".join(f"+{c}" for c in sorted(places.unified)))
        except OSError as error:
            logger.warning(
                "cannot enable %s for %s: %s", ", ".join(sorted(places.unified)), stem, error.strerror or error
            )
            failed += sorted(places.unified)
    v1_made = {tree.root: tree.create(stem) for tree in places.v1_trees(stem, spare=cgroup)}
    for controller in CONTROLLERS:
        if controller in places.unified and controller not in failed:
            where, files = cgroup, _v2_files(controller, limits, cgroup)
        elif controller in places.v1_roots:
            where = v1_made.get(places.v1_roots[controller], cgroup)  # not made: the containment cgroup
            files = _v1_files(controller, limits, where)
        else:
            continue
        for name, value in files:
            try:
                _write(where / name, value)
            except OSError as error:
                logger.warning("cannot set %s to %s for %s: %s", name, value, stem, error.strerror or error)
                failed.append(controller)
                break
    return failed


def close(places: LimitPlaces) -> None:
    """Removes the v1 tessera-<hash> directories where no workload's cgroup is left (the backend closes)."""
    for tree in places.v1_trees(""):
        tree.close()


def remove(places: LimitPlaces, stem: str, spare: Path | None) -> None:
    """Removes the ended workload's (empty) v1 cgroups (their tessera-<hash> directories stay until ``close``)."""
    for tree in places.v1_trees(stem, spare):
        try:
            if not tree.remove(tree.path(stem)):
                logger.warning("cannot remove cgroup %s: processes are still in it", tree.path(stem))
        except OSError as error:
            logger.warning("cannot remove cgroup %s: %s", tree.path(stem), error.strerror or error)


def directories_of(pid: int) -> dict[str, Path]:
    """Per controller (``CONTROLLERS``), the cgroup directory that holds process ``pid`` and has its files: what
    the process is held to, whoever set it (for operators and tests)."""
    found: dict[str, Path] = {}
    unified: Path | None = None
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        number, controllers, path = line.split(":", 2)
        if number == "0":
            mount = cgroups.mount_point("cgroup2")
            unified = None if mount is None else mount / path.lstrip("/")
        for controller in set(controllers.split(",")) & set(CONTROLLERS):
            mount = cgroups.mount_point(controller)
            if mount is not None:
                found[controller] = mount / path.lstrip("/")
    for controller in CONTROLLERS:
        if controller not in found and unified is not None and (unified / f"{controller}.max").exists():
            found[controller] = unified
    return found


def _write(path: Path, value: str) -> None:
    path.write_text(f"{value}\n")


def _v2_files(controller: str, limits: Limits, cgroup: Path) -> list[tuple[str, str]]:
    if controller == "pids":
        return [("pids.max", str(limits.pids_max) if limits.pids_max else "max")]
    if controller == "memory":
        size = str(limits.mem_max_mib * 1024 * 1024) if limits.mem_max_mib else "max"
        swap = [("memory.swap.max", "0")] if limits.mem_max_mib and (cgroup / "memory.swap.max").exists() else []
        return [("memory.max", size), *swap]
    quota = str(_quota_us(limits.cpu_milli)) if limits.cpu_milli else "max"
    weight = min(10_000, max(1, limits.cpu_milli // 10)) if limits.cpu_milli else 100
    return [("cpu.max", f"{quota} {CPU_PERIOD_US}"), ("cpu.weight", str(weight))]


def _v1_files(controller: str, limits: Limits, cgroup: Path) -> list[tuple[str, str]]:
    if controller == "pids":
        return [("pids.max", str(limits.pids_max) if limits.pids_max else "max")]
    if controller == "memory":
        size = str(limits.mem_max_mib * 1024 * 1024) if limits.mem_max_mib else "-1"
        files = [("memory.limit_in_bytes", size)]
        if (cgroup / "memory.memsw.limit_in_bytes").exists():  # memory + swap: never below memory alone
            files.append(("memory.memsw.limit_in_bytes", size))
        return files if limits.mem_max_mib else files[::-1]
    quota = str(_quota_us(limits.cpu_milli)) if limits.cpu_milli else "-1"
    shares = max(2, limits.cpu_milli * 1024 // 1000) if limits.cpu_milli else 1024
    return [("cpu.cfs_period_us", str(CPU_PERIOD_US)), ("cpu.cfs_quota_us", quota), ("cpu.shares", str(shares))]


def _quota_us(cpu_milli: int) -> int:
    return max(MIN_CPU_QUOTA_US, cpu_milli * CPU_PERIOD_US // 1000)
