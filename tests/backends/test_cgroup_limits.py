"""The limit files a workload's cgroups get (``backends/cgroup_limits.py``), written into plain directories that
stand in for cgroup v2 and v1 ones: the values and units of each controller's files, "no limit" spelled as each
version wants it, the controllers enabled for the workload cgroups (v2), and what the server says about where each
controller is. (Real cgroups and processes: tests/backends/test_workload_limits.py.)"""

from __future__ import annotations

import threading
from pathlib import Path

from tessera.backends.cgroup_limits import CONTROLLERS, LimitPlaces, Limits, apply, close, remove
from tessera.backends.cgroups import CgroupTree

LIMITS = Limits(pids_max=40, mem_max_mib=256, cpu_milli=500)


def _files(directory: Path) -> dict[str, str]:
    return {p.name: p.read_text().strip() for p in sorted(directory.iterdir())}


def test_cgroup_v2_files(tmp_path: Path) -> None:
    tree = CgroupTree("cgroup2", tmp_path / "server" / "tessera-x")
    cgroup = tree.root / "w"
    cgroup.mkdir(parents=True)
    (cgroup / "memory.swap.max").write_text("max\n")  # where swap is accounted, the limit covers it too
    places = LimitPlaces(unified=frozenset({"pids", "memory", "cpu"}))
    assert apply(places, tree, cgroup, "w", LIMITS) == []
    assert _files(cgroup) == {
        "cpu.max": "50000 100000",  # half a CPU's time per 100 ms
        "cpu.weight": "50",
        "memory.max": str(256 * 1024 * 1024),
        "memory.swap.max": "0",
        "pids.max": "40",
    }
    assert (tree.root / "cgroup.subtree_control").read_text().strip() == "+cpu +memory +pids"
    apply(places, tree, cgroup, "w", Limits())
    assert _files(cgroup)["cpu.max"] == "max 100000" and _files(cgroup)["cpu.weight"] == "100"
    assert _files(cgroup)["memory.max"] == "max" and _files(cgroup)["pids.max"] == "max"


def test_cgroup_v1_files_in_a_cgroup_of_each_hierarchy(tmp_path: Path) -> None:
    roots = {c: tmp_path / c / "tessera-x" for c in ("pids", "memory", "cpu")}
    for root in roots.values():
        root.parent.mkdir()  # the hierarchy's mount point
    tree = CgroupTree("cgroup2", tmp_path / "unified" / "tessera-x")
    cgroup = tree.root / "w"
    cgroup.mkdir(parents=True)
    places = LimitPlaces(v1_roots=roots)
    assert places.v1_dirs("w", cgroup) == [roots["pids"] / "w", roots["memory"] / "w", roots["cpu"] / "w"]
    assert apply(places, tree, cgroup, "w", LIMITS) == []
    assert _files(roots["pids"] / "w") == {"pids.max": "40"}
    assert _files(roots["memory"] / "w") == {"memory.limit_in_bytes": str(256 * 1024 * 1024)}
    assert _files(roots["cpu"] / "w") == {
        "cpu.cfs_period_us": "100000",
        "cpu.cfs_quota_us": "50000",
        "cpu.shares": "512",
    }
    assert list(cgroup.iterdir()) == []  # nothing in the v2 cgroup: its controllers are elsewhere
    apply(places, tree, cgroup, "w", Limits())
    assert _files(roots["cpu"] / "w")["cpu.cfs_quota_us"] == "-1" and _files(roots["cpu"] / "w")["cpu.shares"] == "1024"
    assert _files(roots["memory"] / "w")["memory.limit_in_bytes"] == "-1"


def test_controllers_that_cannot_be_enabled_are_reported_not_enforced(tmp_path: Path) -> None:
    """A refused write to the workload cgroups' ``cgroup.subtree_control`` failed the launch, where a refused limit
    file is reported; now both are reported (NOT enforced)."""
    tree = CgroupTree("cgroup2", tmp_path / "server" / "tessera-x")
    cgroup = tree.root / "w"
    cgroup.mkdir(parents=True)
    (tree.root / "cgroup.subtree_control").mkdir()  # a file that cannot be written
    places = LimitPlaces(unified=frozenset(CONTROLLERS))
    assert apply(places, tree, cgroup, "w", LIMITS) == ["cpu", "memory", "pids"]
    assert list(cgroup.iterdir()) == []


def test_v1_cgroups_are_made_while_another_workload_s_are_removed(tmp_path: Path) -> None:
    """A launch made its v1 cgroup in two steps (the tessera-<hash> directory, then its own) while the loop removed
    an ended workload's, and the directory with it once empty: the launch failed (FileNotFoundError). The directory
    now stays until the backend closes, and the cgroups are made and removed by ``CgroupTree``. (Plain directories:
    their limit files are removed here, as a cgroup's go with it.)"""
    (tmp_path / "pids").mkdir()
    root = tmp_path / "pids" / "tessera-x"
    places = LimitPlaces(v1_roots={"pids": root})
    tree = CgroupTree("cgroup2", tmp_path / "unified" / "tessera-x")
    errors: list[Exception] = []

    def launch_and_end(name: str) -> None:
        for i in range(400):
            stem = f"{name}{i}"
            try:
                assert apply(places, tree, tree.path(stem), stem, LIMITS) == []
                (root / stem / "pids.max").unlink()
                remove(places, stem, tree.path(stem))
            except (OSError, AssertionError) as error:
                errors.append(error)
                return

    threads = [threading.Thread(target=launch_and_end, args=(name,)) for name in ("a", "b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    close(places)  # the backend closes: its directory goes once empty
    assert errors == [] and not root.exists()


def test_the_containment_cgroup_is_not_joined_twice(tmp_path: Path) -> None:
    pids_root = tmp_path / "pids" / "tessera-x"  # containment kind "pids": the same tree holds the limit
    places = LimitPlaces(v1_roots={"pids": pids_root, "cpu": tmp_path / "cpu" / "tessera-x"})
    assert places.v1_dirs("w", pids_root / "w") == [tmp_path / "cpu" / "tessera-x" / "w"]


def test_what_the_server_and_the_started_event_say() -> None:
    places = LimitPlaces(frozenset({"pids", "cpu"}), missing={"memory": "cgroup v2: /x holds processes of its own"})
    assert places.describe() == (
        "workload limits: pids (cgroup v2), cpu (cgroup v2); NOT enforced: memory (cgroup v2: /x holds processes of "
        "its own)"
    )
    assert Limits().describe() == {
        "pids": "no process limit",
        "memory": "no memory limit",
        "cpu": "no CPU quota (weight of one CPU)",
    }
    assert LIMITS.describe()["cpu"] == "0.5 CPU quota"
