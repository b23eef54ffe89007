"""The local backend with real processes: environment, log, exit codes, stop with and without SIGTERM honoured,
nothing of a workload's process group left behind, and re-adoption by a second backend instance. (Containment and
host isolation: test_containment.py.)"""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tessera.backends.base import ExitStatus, Handle, LaunchSpec
from tessera.backends.launch_intent import NONCE_ENV, Intent, names_exit_file, write_intent
from tessera.backends.local import SUPERVISOR_MODULE, LocalBackend
from tessera.backends.local_watch import Watch
from tessera.backends.procfs import read_cmdline
from tessera.backends.supervisor import CommandSpec, permission_denied
from tessera.core.errors import InvalidRequestError

pytestmark = pytest.mark.e2e

TIMEOUT_S = 5.0

# Counts SIGTERMs, exits 0 a little after the first one.
GRACEFUL_WORKLOAD = """
import signal, sys, time
received = []
signal.signal(signal.SIGTERM, lambda signum, frame: received.append(signum))
print("ready", flush=True)
while not received:
    time.sleep(0.01)
time.sleep(0.3)
print("SIGTERM received" * len(received), flush=True)
"""

# A stand-in server: launches one workload, prints its handle as JSON, then waits to be killed.
SERVER_SCRIPT = """
import json, sys, time
from pathlib import Path
from tessera.backends.base import LaunchSpec
from tessera.backends.local import LocalBackend
ref = LocalBackend(Path(sys.argv[1])).launch(LaunchSpec("w", ("sh", "-c", sys.argv[2])))
print(json.dumps(ref.to_json()), flush=True)
time.sleep(60)
"""


def wait_until(condition: Callable[[], bool], timeout_s: float = TIMEOUT_S) -> None:
    deadline_s = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline_s:
            raise AssertionError(f"condition not met within {timeout_s} s")
        time.sleep(0.02)


def wait_for_exits(backend: LocalBackend, *workload_ids: str, timeout_s: float = TIMEOUT_S) -> dict[str, ExitStatus]:
    """Polls until every one of ``workload_ids`` is reported; checks each is reported once, then no longer tracked."""
    reported: dict[str, ExitStatus] = {}
    deadline_s = time.monotonic() + timeout_s
    while set(workload_ids) - set(reported):
        if time.monotonic() > deadline_s:
            raise AssertionError(f"{sorted(set(workload_ids) - set(reported))} not reported within {timeout_s} s")
        for status in backend.poll():
            assert status.workload_id not in reported, f"{status.workload_id} reported twice"
            reported[status.workload_id] = status
        time.sleep(0.02)
    assert not set(workload_ids) & backend.tracked()
    assert not set(workload_ids) & {status.workload_id for status in backend.poll()}
    return reported


def wait_for_exit(backend: LocalBackend, workload_id: str) -> ExitStatus:
    return wait_for_exits(backend, workload_id)[workload_id]


def pid_of(handle: Handle) -> int:
    """The supervisor's pid in a local handle (which only the local backend and its tests read)."""
    return int(str(handle.data["pid"]))


def local_handle(workload_id: str, pid: int, marker: str, exit_file: str) -> Handle:
    return Handle(workload_id, "local", {"pid": pid, "pgid": pid, "started_marker": marker, "exit_file": exit_file})


def is_running(pid: int) -> bool:
    """True if ``pid`` exists and is not a zombie (independent of the backend's own /proc helpers)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] not in "ZX"


@pytest.fixture
def backend(tmp_path: Path) -> Iterator[LocalBackend]:
    local = LocalBackend(tmp_path / "run")
    yield local
    for workload_id in local.tracked():  # a failed test must not leave processes behind
        local.stop(workload_id, grace_s=0)
    local.close()


def shell(workload_id: str, script: str, log_path: Path, **env: str) -> LaunchSpec:
    return LaunchSpec(workload_id, ("sh", "-c", script), env=env, log_path=log_path, workdir=log_path.parent)


def test_env_is_passed_and_stdout_and_stderr_go_to_the_log(backend: LocalBackend, tmp_path: Path) -> None:
    log = tmp_path / "logs" / "w.log"
    log.parent.mkdir()
    script = 'echo "devices=$CUDA_VISIBLE_DEVICES"; echo "to stderr" >&2; echo "home=$HOME"'
    ref = backend.launch(shell("w", script, log, CUDA_VISIBLE_DEVICES="GPU-1234,MIG-5678"))
    assert ref.backend == "local" and ref.data["pgid"] == ref.data["pid"] and ref.data["started_marker"]
    assert Handle.from_json(json.loads(json.dumps(ref.to_json()))) == ref and backend.tracked() == {"w"}
    assert wait_for_exit(backend, "w") == ExitStatus("w", 0)
    text = log.read_text()
    assert "devices=GPU-1234,MIG-5678" in text
    assert "to stderr" in text
    assert f"home={pwd.getpwuid(os.geteuid()).pw_dir}" in text  # the account's, not the server's environment


def test_exit_codes_are_recorded_and_a_relaunch_ignores_the_old_exit_file(
    backend: LocalBackend, tmp_path: Path
) -> None:
    backend.launch(shell("a", "exit 0", tmp_path / "a.log"))
    backend.launch(shell("b", "exit 3", tmp_path / "b.log"))
    assert wait_for_exits(backend, "a", "b") == {"a": ExitStatus("a", 0), "b": ExitStatus("b", 3)}
    assert backend.exit_path("b").read_text().strip() == "3"

    go = tmp_path / "go"
    backend.launch(shell("b", f"while [ ! -e {go} ]; do sleep 0.02; done; exit 4", tmp_path / "b.log"))
    with pytest.raises(InvalidRequestError):
        backend.launch(shell("b", "exit 0", tmp_path / "b.log"))
    time.sleep(0.1)
    assert backend.poll() == []  # the exit file of the first "b" was removed
    go.touch()
    assert wait_for_exit(backend, "b").exit_code == 4


def test_a_command_not_found_gives_127_and_a_log_line(backend: LocalBackend, tmp_path: Path) -> None:
    log = tmp_path / "missing.log"
    backend.launch(LaunchSpec("m", ("tessera-no-such-command",), log_path=log))
    assert wait_for_exit(backend, "m").exit_code == 127
    lines = log.read_text().splitlines()
    assert any("tessera-no-such-command" in line and "command not found" in line for line in lines)


def test_a_file_that_is_not_executable_gives_126(backend: LocalBackend, tmp_path: Path) -> None:
    script = tmp_path / "script.sh"
    script.write_text("#!/bin/sh\nexit 0\n")  # no execute bit
    backend.launch(LaunchSpec("x", (str(script),), log_path=tmp_path / "x.log"))
    assert wait_for_exit(backend, "x").exit_code == 126


def test_a_refused_start_names_the_file_where_it_links_and_the_user_who_must_reach_it(tmp_path: Path) -> None:
    interpreter = tmp_path / "home" / "python3.11"  # as a virtualenv's python links to one in the server's home
    interpreter.parent.mkdir()
    interpreter.write_text("")
    interpreter.chmod(0o755)
    venv = tmp_path / "venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "python").symlink_to(interpreter)
    on_path = CommandSpec(env={"PATH": str(venv)})
    said = permission_denied("python", "python", on_path)
    assert said == f"permission denied ({venv / 'python'} -> {os.path.realpath(interpreter)})"
    nobody = pwd.getpwnam("nobody").pw_uid
    said = permission_denied("python", "python", CommandSpec(env={"PATH": str(venv)}, uid=nobody))
    assert "the workload runs as user nobody, who must be able to reach the program" in said
    assert "tessera up --run-as server" in said
    assert permission_denied("./x.sh", None, CommandSpec()) == "permission denied (not an executable file)"


def test_processes_left_behind_by_the_command_are_killed(backend: LocalBackend, tmp_path: Path) -> None:
    backend.launch(shell("w", "sleep 1000 & echo $! > grandchild.pid; exit 0", tmp_path / "w.log"))
    assert wait_for_exit(backend, "w").exit_code == 0
    assert not is_running(int((tmp_path / "grandchild.pid").read_text()))


def test_stop_sends_sigterm_which_the_command_honours(backend: LocalBackend, tmp_path: Path) -> None:
    log = tmp_path / "w.log"
    ref = backend.launch(shell("w", "echo ready; exec sleep 1000", log))
    wait_until(lambda: "ready" in log.read_text())
    started_s = time.monotonic()
    backend.stop("w", grace_s=30)
    assert wait_for_exit(backend, "w").exit_code == -15  # ended by SIGTERM, long before the SIGKILL deadline
    assert time.monotonic() - started_s < 5
    assert backend.exit_path("w").read_text().strip() == "-15"  # written by the supervisor
    assert "ended by signal SIGTERM" in log.read_text()
    assert not is_running(pid_of(ref))
    backend.stop("w", grace_s=1)  # no longer tracked: a no-op


def test_a_command_that_handles_sigterm_may_exit_cleanly(backend: LocalBackend, tmp_path: Path) -> None:
    log = tmp_path / "w.log"
    backend.launch(LaunchSpec("w", (sys.executable, "-c", GRACEFUL_WORKLOAD), log_path=log))
    wait_until(lambda: "ready" in log.read_text())
    backend.stop("w", grace_s=30)
    assert wait_for_exit(backend, "w").exit_code == 0
    # Handled once. (Pending signals coalesce, so this alone cannot prove the supervisor relays a SIGTERM once.)
    assert log.read_text().count("SIGTERM received") == 1


def test_stop_right_after_launch(backend: LocalBackend, tmp_path: Path) -> None:
    ref = backend.launch(shell("w", "echo started; sleep 1000", tmp_path / "w.log"))
    backend.stop("w", grace_s=30)  # most likely before the supervisor could start the command
    assert wait_for_exit(backend, "w").exit_code == -15
    assert not is_running(pid_of(ref))


def test_stop_kills_a_command_that_ignores_sigterm_and_its_whole_group(backend: LocalBackend, tmp_path: Path) -> None:
    log = tmp_path / "w.log"
    script = "trap '' TERM; sleep 1000 & echo $! > grandchild.pid; echo ready; while :; do sleep 0.05; done"
    ref = backend.launch(shell("w", script, log))
    wait_until(lambda: "ready" in log.read_text())
    grandchild_pid = int((tmp_path / "grandchild.pid").read_text())
    assert is_running(grandchild_pid)
    grace_s = 0.5
    started_s = time.monotonic()
    backend.stop("w", grace_s=grace_s)
    time.sleep(0.2)
    assert backend.poll() == [] and is_running(grandchild_pid)  # SIGTERM ignored, grace not over yet
    assert wait_for_exit(backend, "w").exit_code == -9
    assert time.monotonic() - started_s >= grace_s
    assert not is_running(grandchild_pid)
    assert not is_running(pid_of(ref))


def test_a_second_backend_adopts_a_running_workload_and_reports_its_exit_code(tmp_path: Path) -> None:
    go = tmp_path / "go"
    first = LocalBackend(tmp_path / "run")
    ref = first.launch(shell("w", f"while [ ! -e {go} ]; do sleep 0.02; done; exit 7", tmp_path / "w.log"))
    first.close()
    assert first.tracked() == set()
    time.sleep(0.1)
    assert is_running(pid_of(ref))  # close() left it running

    second = LocalBackend(tmp_path / "run")
    second.adopt(ref)
    assert second.tracked() == {"w"}
    assert second.poll() == []
    go.touch()
    assert wait_for_exit(second, "w") == ExitStatus("w", 7)


def test_the_workload_outlives_a_server_killed_with_sigkill(tmp_path: Path) -> None:
    go = tmp_path / "go"
    script = f"while [ ! -e {go} ]; do sleep 0.02; done; exit 7"
    server = subprocess.Popen(
        [sys.executable, "-c", SERVER_SCRIPT, str(tmp_path / "run"), script],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert server.stdout is not None
    ref = Handle.from_json(json.loads(server.stdout.readline()))
    server.kill()
    server.wait()
    assert is_running(pid_of(ref))
    backend = LocalBackend(tmp_path / "run")
    assert backend.find("w") == ref  # what a server that died before storing the ref recovers by
    assert backend.find("other") is None
    backend.adopt(ref)
    assert backend.poll() == []
    go.touch()
    assert wait_for_exit(backend, "w") == ExitStatus("w", 7)
    assert backend.find("w") == ref  # its end was reported, not stored yet: still found
    backend.forget("w")
    assert backend.find("w") is None  # its end was stored


def test_an_adopted_workload_can_be_stopped(tmp_path: Path) -> None:
    log = tmp_path / "w.log"
    first = LocalBackend(tmp_path / "run")
    ref = first.launch(shell("w", "trap '' TERM; echo ready; while :; do sleep 0.05; done", log))
    wait_until(lambda: "ready" in log.read_text())
    first.close()
    second = LocalBackend(tmp_path / "run")
    second.adopt(ref)
    second.stop("w", grace_s=0.2)
    assert wait_for_exit(second, "w").exit_code == -9
    assert not is_running(pid_of(ref))


def test_adopting_a_workload_that_already_ended_reports_it_at_the_next_poll(tmp_path: Path) -> None:
    first = LocalBackend(tmp_path / "run")
    ref = first.launch(shell("w", "exit 5", tmp_path / "w.log"))
    first.close()
    wait_until(lambda: Path(str(ref.data["exit_file"])).exists() and not is_running(pid_of(ref)))
    second = LocalBackend(tmp_path / "run")
    second.adopt(ref)
    assert second.poll() == [ExitStatus("w", 5)]
    assert second.tracked() == set()


def test_a_reused_pid_is_treated_as_ended_and_left_alone(tmp_path: Path) -> None:
    stranger = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        wait_until(lambda: is_running(stranger.pid))
        ref = local_handle("w", stranger.pid, "1", str(tmp_path / "run" / "w.exit"))
        backend = LocalBackend(tmp_path / "run")
        backend.adopt(ref)
        backend.stop("w", grace_s=0)  # must not signal the stranger
        assert backend.poll() == [ExitStatus("w", None)]
        time.sleep(0.05)
        assert stranger.poll() is None
        backend.adopt(local_handle("v", 2**22 + 1, "1", str(tmp_path / "run" / "v.exit")))  # no such pid at all
        assert backend.poll() == [ExitStatus("v", None)]
    finally:
        stranger.kill()
        stranger.wait()


def test_launch_rejects_an_empty_command_and_a_missing_workdir(backend: LocalBackend, tmp_path: Path) -> None:
    with pytest.raises(InvalidRequestError, match="argv"):
        backend.launch(LaunchSpec("w", ()))
    with pytest.raises(NotADirectoryError):  # an OSError: the server records "could not start"
        backend.launch(LaunchSpec("w", ("true",), workdir=tmp_path / "absent"))
    assert backend.tracked() == set()


def test_nodes_pids_and_handles_of_other_backends(backend: LocalBackend, tmp_path: Path) -> None:
    assert [node.name for node in backend.nodes()] == ["local"]
    log = tmp_path / "w.log"
    ref = backend.launch(shell("w", "sleep 1000 & echo ready; wait", log))
    wait_until(lambda: "ready" in log.read_text())
    pids = backend.pids(ref)
    assert pid_of(ref) in pids and len(pids) >= 3  # the supervisor, the shell and its sleep: the whole group
    with pytest.raises(InvalidRequestError, match="handle"):
        backend.adopt(Handle("x", "ray", {"actor": "abc"}))
    backend.stop("w", grace_s=0)
    wait_for_exit(backend, "w")
    assert backend.pids(ref) == []


def test_find_reads_a_reference_file_written_before_handles(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path / "run")
    old = {"workload_id": "w", "pid": 2**22 + 1, "pgid": 2**22 + 1, "started_marker": "1", "exit_file": "/x/w.exit"}
    backend.ref_path("w").write_text(json.dumps(old))
    assert backend.find("w") == local_handle("w", 2**22 + 1, "1", "/x/w.exit")
    backend.ref_path("v").write_text("{}")
    assert backend.find("v") is None


# A stand-in server that dies by TESSERA_CRASH_AT=after-launch: right after the fork, before the reference file.
CRASHING_SERVER_SCRIPT = """
import sys
from pathlib import Path
from tessera.backends.base import LaunchSpec
from tessera.backends.local import LocalBackend
LocalBackend(Path(sys.argv[1])).launch(LaunchSpec("w", ("sh", "-c", sys.argv[2])))
print("not reached", flush=True)
"""


def crash_after_launch(run_dir: Path, script: str) -> None:
    """Runs the stand-in server with ``TESSERA_CRASH_AT=after-launch``; checks that it died by SIGKILL."""
    env = {**os.environ, "TESSERA_CRASH_AT": "after-launch"}
    server = subprocess.run(
        [sys.executable, "-c", CRASHING_SERVER_SCRIPT, str(run_dir), script], env=env, capture_output=True, timeout=30
    )
    assert server.returncode == -9, server.stderr
    assert b"not reached" not in server.stdout and b"crashing at after-launch" in server.stderr


def test_find_finds_a_supervisor_that_a_crash_kept_from_its_reference_file(tmp_path: Path) -> None:
    go = tmp_path / "go"
    crash_after_launch(tmp_path / "run", f"while [ ! -e {go} ]; do sleep 0.02; done; exit 7")
    backend = LocalBackend(tmp_path / "run")
    assert not backend.ref_path("w").exists() and backend.intent_path("w").exists()
    found = backend.find("w")  # before the launch intent, None: the restarted server launched "w" a second time
    assert found is not None and is_running(pid_of(found))
    argv = Path(f"/proc/{pid_of(found)}/cmdline").read_bytes().split(b"\0")
    assert argv[argv.index(b"-m") + 1] == b"tessera.backends.supervisor"
    assert found.data["exit_file"] == str(backend.exit_path("w"))
    backend.adopt(found)
    assert backend.poll() == [] and set(backend.pids(found)) >= {pid_of(found)}
    go.touch()
    assert wait_for_exit(backend, "w") == ExitStatus("w", 7)
    backend.forget("w")
    assert backend.find("w") is None and not backend.intent_path("w").exists()  # stored: nothing left to find


def test_find_reports_a_workload_that_ended_while_no_reference_file_pointed_to_it(tmp_path: Path) -> None:
    crash_after_launch(tmp_path / "run", "exit 5")
    backend = LocalBackend(tmp_path / "run")
    wait_until(lambda: backend.exit_path("w").exists())
    time.sleep(0.2)  # the supervisor kills its group after writing the exit file
    found = backend.find("w")
    assert found is not None and found.data["pid"] == 0  # no process left: its end is in the exit file
    assert backend.pids(found) == []
    backend.adopt(found)
    backend.stop("w", grace_s=0)  # a handle without a process signals nothing (pid 0 would be our own group)
    assert backend.poll() == [ExitStatus("w", 5)]
    backend.forget("w")
    assert backend.find("w") is None


def test_find_ignores_an_old_exit_file_an_intent_that_started_nothing_and_lookalikes(
    backend: LocalBackend, tmp_path: Path
) -> None:
    backend.launch(shell("w", "exit 3", tmp_path / "w.log"))
    wait_for_exit(backend, "w")
    backend.forget("w")
    assert backend.exit_path("w").exists() and backend.find("w") is None  # ended and stored: not found again

    # An intent whose launch never started the supervisor (a crash before the fork): nothing to find.
    exit_file = backend.exit_path("v")
    intent = Intent.new("v", exit_file)
    write_intent(backend.intent_path("v"), intent)
    assert backend.find("v") is None

    # A process that copies a supervisor's command line (anyone can read it) is taken only with the launch's nonce.
    argv = [sys.executable, "-c", "import time; time.sleep(30)", "-m", SUPERVISOR_MODULE, "--exit-file", str(exit_file)]
    for nonce, found in [(None, False), ("another launch", False), (intent.nonce, True)]:
        env = {**os.environ, NONCE_ENV: nonce} if nonce else dict(os.environ)
        lookalike = subprocess.Popen([*argv, "--", "x"], env=env, start_new_session=True)
        try:
            pid = lookalike.pid
            wait_until(lambda: names_exit_file(read_cmdline(pid) or [], SUPERVISOR_MODULE, str(exit_file)))  # noqa: B023
            handle = backend.find("v")
            assert (handle is not None and pid_of(handle) == lookalike.pid) is found, nonce
        finally:
            lookalike.kill()
            lookalike.wait()


def test_an_end_reported_to_a_server_that_died_before_storing_it_is_found_and_reported_again(
    backend: LocalBackend, tmp_path: Path
) -> None:
    """Issue 25: ``poll`` removed the reference file and the launch intent as it reported an end, so a server killed
    before it stored that end (and before it stored the handle) found nothing and launched the workload again."""
    backend.launch(shell("w", "exit 6", tmp_path / "w.log"))
    assert wait_for_exit(backend, "w") == ExitStatus("w", 6)
    backend.close()  # the server died before it stored the end
    restarted = LocalBackend(tmp_path / "run")
    found = restarted.find("w")
    assert found is not None and not is_running(pid_of(found))
    restarted.adopt(found)
    assert wait_for_exit(restarted, "w") == ExitStatus("w", 6)  # reported again: the new server stores it
    restarted.forget("w")
    assert restarted.find("w") is None
    assert not restarted.ref_path("w").exists() and not restarted.intent_path("w").exists()
    restarted.close()


def test_forget_keeps_a_running_workload_and_a_new_launch_drops_an_old_reference(
    backend: LocalBackend, tmp_path: Path
) -> None:
    go = tmp_path / "go"
    first = backend.launch(shell("w", f"while [ ! -e {go} ]; do sleep 0.02; done", tmp_path / "w.log"))
    backend.forget("w")  # it runs: nothing is dropped
    assert backend.ref_path("w").exists() and backend.find("w") == first
    go.touch()
    wait_for_exit(backend, "w")
    assert backend.find("w") == first  # ended and not forgotten: its files stay for a server that did not store it
    # Bound anew without a forget (a crash), and this launch fails after its intent is written (its log cannot be
    # opened): the first run's reference is dropped all the same, so nothing takes that run for this launch.
    (tmp_path / "a-directory.log").mkdir()
    with pytest.raises(IsADirectoryError):
        backend.launch(shell("w", "exit 0", tmp_path / "a-directory.log"))
    assert backend.find("w") is None and not backend.ref_path("w").exists()
    second = backend.launch(shell("w", "sleep 5", tmp_path / "w.log"))
    assert backend.find("w") == second != first
    backend.stop("w", grace_s=0)
    wait_for_exit(backend, "w")


class FailsOnce(LocalBackend):
    """The local backend, except that its first SIGTERM (``_terminate``) raises as a host out of file descriptors
    would, and the first collection of workload "b"'s end (``_report``) raises an unexpected error; no signal is ever
    sent (the workloads of these tests are handles without processes)."""

    def __init__(self, run_dir: Path) -> None:
        super().__init__(run_dir)
        self.terminations = 0
        self.report_failed = False

    def _terminate(self, watch: Watch) -> None:
        self.terminations += 1
        if self.terminations == 1:
            raise OSError(24, "Too many open files")

    def _report(self, watch: Watch, left: list[int], now_s: float) -> ExitStatus | None:
        if watch.ref.workload_id == "b" and not self.report_failed:
            self.report_failed = True
            raise RuntimeError("the end of b cannot be collected yet")
        return super()._report(watch, left, now_s)


NO_SUCH_PID = 2**22 + 1  # above the kernel's pid_max: no process has it


def test_a_stop_whose_sigterm_failed_sends_it_again_when_asked_again(tmp_path: Path) -> None:
    """Before, the SIGTERM counted as sent before it was: the loop's second stop sent none, and the workload got only
    the SIGKILL at the end of its grace."""
    backend = FailsOnce(tmp_path / "run")
    backend.adopt(local_handle("w", NO_SUCH_PID, "1", str(tmp_path / "run" / "w.exit")))
    with pytest.raises(OSError, match="Too many open files"):
        backend.stop("w", grace_s=30)
    backend.stop("w", grace_s=30)  # the loop sends a refused stop again
    assert backend.terminations == 2
    backend.stop("w", grace_s=30)
    assert backend.terminations == 2  # sent once it went out
    backend.close()


def test_an_end_that_cannot_be_collected_loses_no_other_end_of_the_same_poll(tmp_path: Path) -> None:
    """Before, "a"'s end was taken out of the watched workloads, then "b"'s raised: "a" was never reported."""
    backend = FailsOnce(tmp_path / "run")
    for workload_id in ("a", "b"):  # both ended: their pids name no process
        backend.adopt(local_handle(workload_id, NO_SUCH_PID, "1", str(tmp_path / "run" / f"{workload_id}.exit")))
    assert backend.poll() == [ExitStatus("a", None)]
    assert backend.tracked() == {"b"}
    assert backend.poll() == [ExitStatus("b", None)]
    assert backend.tracked() == set()
    backend.close()


def test_only_the_supervisors_own_options_name_its_exit_file() -> None:
    module, exit_file = SUPERVISOR_MODULE, "/run/7.exit"
    assert names_exit_file(["python", "-m", module, "--exit-file", exit_file, "--", "sleep", "1"], module, exit_file)
    assert not names_exit_file(["python", "-m", module, "--exit-file", "/run/8.exit", "--", "x"], module, exit_file)
    assert not names_exit_file(["sh", "--", "-m", module, "--exit-file", exit_file], module, exit_file)
    assert not names_exit_file(["python", "-m", "other", "--exit-file", exit_file], module, exit_file)
    assert not names_exit_file(["python", "-m", module, "--exit-file"], module, exit_file)


def test_a_relative_run_dir_works_although_the_supervisor_runs_from_the_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``tessera up``'s default data directory is the relative ``.tessera``; the supervisor starts in ``/``, so the
    spec and exit files it is handed must not be relative (they were: every workload of ``make run`` vanished)."""
    monkeypatch.chdir(tmp_path)
    backend = LocalBackend(Path(".tessera") / "runs")
    backend.launch(LaunchSpec("w", ("sh", "-c", "exit 4"), log_path=Path(".tessera") / "w.log"))

    assert wait_for_exit(backend, "w").exit_code == 4
    assert (tmp_path / ".tessera" / "runs" / "w.exit").read_text().strip() == "4"
