"""``procfs.live_members_of_groups``: one scan of ``/proc`` answers for many process groups, zombies left out (the
local backend's ``poll`` makes one such scan for all the workloads that ended, not one per workload)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator

import pytest

from tessera.backends import procfs

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads Linux's /proc")


@pytest.fixture
def groups() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for process in started:
        os.killpg(process.pid, signal.SIGKILL)  # the whole group: the leader and what it started
        process.wait()


def _wait_for(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "the processes did not reach the expected state"
        time.sleep(0.01)


def test_one_scan_lists_the_live_members_of_each_group_and_no_zombie(groups: list[subprocess.Popen[bytes]]) -> None:
    # A group whose leader runs on after its child exited unreaped (exec'd sleep never waits): a zombie member.
    with_zombie = subprocess.Popen(["sh", "-c", "sleep 0 & exec sleep 30"], start_new_session=True)
    two_live = subprocess.Popen(["sh", "-c", "sleep 30 & sleep 30"], start_new_session=True)
    groups += [with_zombie, two_live]

    def settled() -> bool:  # the child has exited (a zombie now, not merely started) and the other group is up
        others = [p for p in _members_any_state(with_zombie.pid) if p != with_zombie.pid]
        zombies = [p for p in others if (stat := procfs.read_proc_stat(p)) is not None and stat.state == "Z"]
        live = procfs.live_members_of_groups({two_live.pid}).get(two_live.pid, [])
        return len(others) == 1 and len(zombies) == 1 and len(live) == 3

    _wait_for(settled)
    found = procfs.live_members_of_groups({with_zombie.pid, two_live.pid, 2**22 + 1})
    assert found[with_zombie.pid] == [with_zombie.pid]  # the zombie is not counted
    assert len(found[two_live.pid]) == 3 and two_live.pid in found[two_live.pid]
    assert 2**22 + 1 not in found  # a group with no process is left out
    assert procfs.live_group_members(two_live.pid) == found[two_live.pid]
    assert procfs.live_members_of_groups(set()) == {}


def _members_any_state(pgid: int) -> list[int]:
    """Every process of group ``pgid``, zombies included (what a scan sees before it filters)."""
    members = []
    for entry in procfs.PROC_ROOT.iterdir():
        if entry.name.isdigit():
            stat = procfs.read_proc_stat(int(entry.name))
            if stat is not None and stat.pgid == pgid:
                members.append(stat.pid)
    return members
