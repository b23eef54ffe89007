"""What a workload of the local backend is held to, with real processes: its processes, memory and CPU in its
cgroups (a fork bomb stopped by ``pids.max``), and its log's cap where the bytes are written (a workload writing far
past the cap leaves at most about twice the cap on disk, whatever its pace), with the supervisor's guarantees kept:
every byte written before the end is in the log, and a process that outlives the command holding the log's pipe
does not hold up the end. (The same through ``tessera up`` as root: tests/server/test_workload_limits_e2e.py.)"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_local_backend import wait_for_exit, wait_for_exits, wait_until

from tessera.backends import cgroup_limits
from tessera.backends.base import LaunchSpec
from tessera.backends.capped_log import rotated_path
from tessera.backends.local import SUPERVISOR_MODULE, LocalBackend
from tessera.backends.log_pipe import CHUNK_BYTES
from tessera.backends.supervisor import CommandSpec
from tessera.server.logfiles import LogFiles

pytestmark = pytest.mark.e2e

CAP_BYTES = 256 * 1024
FLOOD_BYTES = 40 * 1024 * 1024


@pytest.fixture
def backend(tmp_path: Path) -> Iterator[LocalBackend]:
    local = LocalBackend(tmp_path / "run")
    yield local
    for workload_id in local.tracked():
        local.stop(workload_id, grace_s=0)
    local.close()


def _on_disk(log: Path) -> int:
    """The bytes of the log's two files on disk."""
    total = 0
    for path in (log, rotated_path(log)):
        with contextlib.suppress(FileNotFoundError):  # between a rotation's rename and its new file
            total += path.stat().st_size
    return total


def test_a_workload_writing_far_past_the_cap_leaves_at_most_twice_the_cap(
    backend: LocalBackend, tmp_path: Path
) -> None:
    """The old backend handed the log file to the workload, and only the server's rotation, every 2 s, cut it: a fast
    writer put hundreds of MiB on disk in between. Now the supervisor writes it and rotates before the cap."""
    log = tmp_path / "logs" / "flood.log"
    script = f"head -c {FLOOD_BYTES} /dev/zero | tr '\\0' x; echo; echo the end"
    backend.launch(LaunchSpec("flood", ("sh", "-c", script), log_path=log, workdir=tmp_path, log_max_bytes=CAP_BYTES))
    most = 0
    while backend.tracked():
        most = max(most, _on_disk(log))
        backend.poll()
        time.sleep(0.002)
    most = max(most, _on_disk(log))
    print(f"log cap {CAP_BYTES} B, {FLOOD_BYTES} B written: at most {most} B on disk")
    assert most <= 2 * CAP_BYTES + CHUNK_BYTES
    assert log.stat().st_size <= CAP_BYTES
    logs = LogFiles(lambda _: log)
    tail = logs.read(0, logs.tail_offset(0, 1), 100, finished=True)
    assert tail.data == b"the end\n" and tail.next_offset == FLOOD_BYTES + len(b"\nthe end\n")


def test_every_byte_before_the_end_is_logged_and_a_lingering_writer_does_not_hold_the_end(
    backend: LocalBackend, tmp_path: Path
) -> None:
    log = tmp_path / "w.log"
    script = "sleep 300 & seq 1 100000; echo to stderr >&2; exit 3"  # sleep keeps the pipe open, till it is killed
    backend.launch(LaunchSpec("w", ("sh", "-c", script), log_path=log, workdir=tmp_path))
    started_s = time.monotonic()
    assert wait_for_exit(backend, "w").exit_code == 3
    assert time.monotonic() - started_s < 4.0  # the drain after the command's end is bounded (1 s)
    lines = log.read_text().splitlines()
    assert lines[:100000] == [str(i) for i in range(1, 100001)] and lines[100000] == "to stderr"


def test_a_workload_without_a_log_writes_nowhere(
    backend: LocalBackend, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    before = set(tmp_path.rglob("*"))
    backend.launch(LaunchSpec("quiet", ("sh", "-c", "echo nothing; echo nothing >&2; exit 0"), workdir=tmp_path))
    assert wait_for_exit(backend, "quiet").exit_code == 0
    made = {path.relative_to(tmp_path) for path in set(tmp_path.rglob("*")) - before}
    assert all(path.parts[0] == "run" and ".log" not in path.name for path in made)  # the backend's own files only
    assert "nothing" not in "".join(capfd.readouterr())  # nor the server's stdout or stderr


def test_output_that_cannot_be_logged_is_counted_in_the_log(backend: LocalBackend, tmp_path: Path) -> None:
    """What a log that cannot rotate (here its directory is immutable; elsewhere a full disk) drops to keep its cap
    was counted and never said. Now the supervisor's last words say how much."""
    logs = tmp_path / "logs"
    logs.mkdir()
    log = logs / "w.log"
    log.touch()  # made before the directory is closed to new names (and renames)
    if os.geteuid() != 0 or subprocess.run(["chattr", "+i", str(logs)], capture_output=True).returncode != 0:
        pytest.skip("cannot make a directory immutable here (chattr +i: root, a file system that has it)")
    output_bytes = sum(len(f"{i}\n") for i in range(1, 20001))  # more than a chunk: the second cannot go in
    try:
        backend.launch(LaunchSpec("w", ("seq", "1", "20000"), log_path=log, workdir=tmp_path, log_max_bytes=1000))
        assert wait_for_exit(backend, "w").exit_code == 0
    finally:
        subprocess.run(["chattr", "-i", str(logs)], check=True)
    kept, _, said = log.read_text().rpartition("tessera-supervisor: ")
    dropped = int(said.split()[0])
    assert said == f"{dropped} bytes of the command's output were dropped: the log could not be written or rotated\n"
    assert len(kept) + dropped == output_bytes and 0 < len(kept) <= CHUNK_BYTES


def _require_limits(backend: LocalBackend) -> None:
    missing = backend.exec.limit_places.missing
    if os.geteuid() != 0 or "pids" in missing or "memory" in missing:
        pytest.skip(f"this host does not let the server set cgroup limits: {backend.exec.limit_places.describe()}")


def _read(directory: Path, *names: str) -> str:
    for name in names:
        if (directory / name).exists():
            return (directory / name).read_text().strip()
    raise AssertionError(f"none of {names} in {directory}")


def test_the_limits_are_in_the_workloads_cgroups_and_a_fork_bomb_stops_at_pids_max(
    backend: LocalBackend, tmp_path: Path
) -> None:
    _require_limits(backend)
    # Each shell starts two more, 10 levels down: 2047 shells and their sleeps, bounded by the test; pids.max: 40.
    # The shell forks nothing once the bomb has gone off (a shell whose fork fails exits): it waits for its sleep.
    bomb = "b() { [ $1 -gt 0 ] && { b $(($1 - 1)) & b $(($1 - 1)) & }; sleep 3; }; "
    bomb += "sleep 60 & k=$!; (b 10) & echo $$ > pid; wait $k"
    log = tmp_path / "bomb.log"
    spec = LaunchSpec("bomb", ("sh", "-c", bomb), log_path=log, workdir=tmp_path)
    handle = backend.launch(dataclasses.replace(spec, pids_max=40, mem_max_mib=256, cpu_milli=500))
    assert handle.note == "limits: 40 processes, 256 MiB memory, 0.5 CPU quota"
    wait_until(lambda: (tmp_path / "pid").exists() and (tmp_path / "pid").read_text().strip() != "")
    directories = cgroup_limits.directories_of(int((tmp_path / "pid").read_text()))
    assert _read(directories["pids"], "pids.max") == "40"
    assert _read(directories["memory"], "memory.max", "memory.limit_in_bytes") == str(256 * 1024 * 1024)
    cpu = _read(directories["cpu"], "cpu.max", "cpu.cfs_quota_us")
    assert cpu in ("50000 100000", "50000")
    wait_until(lambda: "max 0" not in _read(directories["pids"], "pids.events"), timeout_s=10)
    refused = int(_read(directories["pids"], "pids.events").split()[-1])
    assert refused > 0  # forks were refused by pids.max (not only bounded by the script)
    wait_until(lambda: "Cannot fork" in log.read_text(), timeout_s=10)  # copied by the supervisor, in the quota
    backend.stop("bomb", grace_s=0)
    wait_for_exit(backend, "bomb")
    assert not any(d.exists() for d in directories.values())  # removed with the workload


def test_a_workload_over_its_memory_limit_is_killed_inside_it(backend: LocalBackend, tmp_path: Path) -> None:
    _require_limits(backend)
    # tail keeps a line without a newline whole: 300 MB of memory against a limit of 64 MiB.
    script = "head -c 300000000 /dev/zero | tail -n 1 | wc -c; echo after"
    spec = LaunchSpec("hog", ("sh", "-c", script), log_path=tmp_path / "hog.log", workdir=tmp_path)
    backend.launch(dataclasses.replace(spec, mem_max_mib=64))
    assert wait_for_exit(backend, "hog").exit_code == 0  # the shell goes on: only the hog was killed
    words = (tmp_path / "hog.log").read_text().split()
    assert sorted(words[:2]) == ["0", "Killed"] and words[2:] == ["after"]  # tail was OOM-killed before it wrote


def test_memory_in_no_process_s_rss_kills_the_workload_s_processes_not_its_supervisor(
    backend: LocalBackend, tmp_path: Path
) -> None:
    """Files in /dev/shm (a tmpfs) are charged to the workload's memory but are in no process's RSS: the supervisor,
    the biggest process of the cgroup, was OOM-killed first (exit -9, an empty log, no exit file). Now a process of
    the workload goes first, and the supervisor writes the exit code and, when it is its command, says why."""
    _require_limits(backend)
    files = {name: Path(f"/dev/shm/tessera-test-{uuid.uuid4().hex}") for name in ("survives", "killed")}
    fill = "dd if=/dev/zero of={} bs=1M count=200 2>/dev/null"
    scripts = {
        "survives": fill.format(files["survives"]) + "; echo after dd; exit 5",  # dd is killed, its shell goes on
        "killed": "exec " + fill.format(files["killed"]),  # the command itself is killed
    }
    try:
        for name, script in scripts.items():
            spec = LaunchSpec(name, ("sh", "-c", script), log_path=tmp_path / f"{name}.log", workdir=tmp_path)
            backend.launch(dataclasses.replace(spec, mem_max_mib=64))
        ended = wait_for_exits(backend, *scripts, timeout_s=30)
    finally:
        for path in files.values():
            path.unlink(missing_ok=True)
    assert ended["survives"].exit_code == 5  # the shell's own code, from the exit file the supervisor wrote
    assert "after dd" in (tmp_path / "survives.log").read_text().splitlines()
    assert ended["killed"].exit_code == -9
    assert (tmp_path / "killed.log").read_text() == (
        "tessera-supervisor: 'sh' was ended by signal SIGKILL: out of memory (the kernel killed 1 process(es) of the "
        "workload at its memory limit)\n"
    )


def test_a_log_that_cannot_be_capped_fails_the_start_instead_of_being_written_uncapped(tmp_path: Path) -> None:
    """When the supervisor cannot start the thread that copies the command's output (a host or cgroup out of PIDs),
    the command wrote the log itself, uncapped. Now it is not started (126, one line). No thread: the supervisor's
    python runs with a stack limit larger than the host's memory, which pthreads take as a thread's stack size."""
    if Path("/proc/sys/vm/overcommit_memory").read_text().strip() == "1":
        pytest.skip("memory is overcommitted without a check here: a huge thread stack would be granted")
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nulimit -S -s 1073741824 && exec {sys.executable} "$@"\n')
    python.chmod(0o755)
    local = LocalBackend(tmp_path / "run", python=str(python))
    log = tmp_path / "w.log"
    try:
        local.launch(LaunchSpec("w", ("sh", "-c", "echo ran"), log_path=log, workdir=tmp_path, log_max_bytes=1000))
        assert wait_for_exit(local, "w").exit_code == 126
    finally:
        local.close()
    assert (
        log.read_text()
        == f"tessera-supervisor: cannot cap the log {log} (can't start new thread): the command is not started\n"
    )


def test_a_limit_cgroup_that_cannot_be_joined_fails_the_start(tmp_path: Path) -> None:
    """The supervisor only warned and ran the command outside its v1 limit cgroup, while the started event said the
    limits held. Now the command is not started (126, one line)."""
    gone = tmp_path / "gone"
    spec_file, exit_file, log = tmp_path / "spec.json", tmp_path / "w.exit", tmp_path / "w.log"
    spec_file.write_text(json.dumps(CommandSpec(limit_cgroups=(str(gone),)).to_json()))
    command = [sys.executable, "-s", "-P", "-m", SUPERVISOR_MODULE, "--exit-file", str(exit_file)]
    command += ["--spec", str(spec_file), "--", "sh", "-c", "echo ran"]
    with log.open("wb") as out:
        subprocess.run(command, stdout=out, stderr=out, start_new_session=True, timeout=30, check=False)
    assert exit_file.read_text() == "126\n"
    assert log.read_text() == (
        f"tessera-supervisor: cannot join cgroup {gone} (No such file or directory): its limits would not hold; the "
        "command is not started\n"
    )
