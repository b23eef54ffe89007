"""The job options against a real ``tessera up`` through the CLI, as a user would type them: ``submit -- python
train.py`` from a project directory runs that file there and its prints reach ``tessera logs -f`` within a second
(measured per line); a walltime stops a job and ``show`` says why; an array's tasks see their index; a dependency
waits; hold and release; cancel by name prints what it cancelled; bad flags are one line and exit code 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from live_server import ADMIN, LiveServer, wait_for

pytestmark = pytest.mark.e2e

# Prints its directory, waits for the test's go (so that ``logs -f``'s own start-up is not counted), then prints a
# time stamp every 0.4 s: each line's delay is the time from its print to its arrival through ``tessera logs -f``.
TRAIN = """\
import os, time
print("cwd", os.getcwd())
while not os.path.exists("go"):
    time.sleep(0.02)
for step in range(6):
    print("step", step, time.time())
    time.sleep(0.4)
"""
LATENCY_LIMIT_S = 1.0


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    live = LiveServer(tmp_path_factory.mktemp("jobs") / "data", gpus="2xA100-80GB")
    live.start()
    yield live
    live.cancel_all()
    live.stop()


def _env(server: LiveServer) -> dict[str, str]:
    # The submitter's PATH leads to this interpreter as ``python`` (its virtualenv): submit sends it by default.
    path = f"{Path(sys.executable).parent}:/usr/bin:/bin"
    env = {"TESSERA_URL": server.url, "TESSERA_TOKEN": ADMIN, "PATH": path, "HOME": "/nonexistent", "RUN": "r7"}
    paths = [os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if paths:
        env["PYTHONPATH"] = os.pathsep.join(paths)
    return env


def tessera(server: LiveServer, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "tessera.cli", *args]
    return subprocess.run(command, capture_output=True, text=True, env=_env(server), timeout=60, cwd=cwd)


def _show(server: LiveServer, workload_id: int) -> dict[str, Any]:
    """Polled through the SDK: a CLI process per poll would cost its start-up each time."""
    with server.client() as client:
        return client.workload(workload_id)


def _ended(server: LiveServer, workload_id: int, timeout_s: float = 30.0) -> dict[str, Any]:
    def ended() -> dict[str, Any] | None:
        shown = _show(server, workload_id)
        return shown if shown["state"] not in ("pending", "running") else None

    return wait_for(ended, timeout_s=timeout_s)


def test_python_train_py_runs_in_the_submit_directory_and_logs_follow_within_a_second(
    server: LiveServer, tmp_path: Path
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text(TRAIN)
    done = tessera(server, "submit", "--json", "--", "python", "train.py", cwd=project)  # PATH: sent by default
    assert done.returncode == 0, done.stderr
    created = json.loads(done.stdout)
    assert created["cwd"] == str(project)
    follow = subprocess.Popen(
        [sys.executable, "-m", "tessera.cli", "logs", "-f", str(created["id"])],
        stdout=subprocess.PIPE,
        text=True,
        env=_env(server),
    )
    assert follow.stdout is not None
    lines: list[str] = []
    delays: list[float] = []
    for line in follow.stdout:
        arrived = time.time()
        lines.append(line)
        if line.startswith("cwd"):
            (project / "go").touch()
        if line.startswith("step"):
            delays.append(arrived - float(line.split()[2]))
    assert follow.wait(timeout=30) == 0
    assert lines[0] == f"cwd {project}\n" and len(delays) == 6, lines
    print(f"logs -f delay per line: max {max(delays):.3f} s, mean {sum(delays) / len(delays):.3f} s")
    assert max(delays) < LATENCY_LIMIT_S, delays
    assert _ended(server, created["id"])["state"] == "succeeded"


def test_walltime_ends_the_job_failed_with_the_reason_shown(server: LiveServer) -> None:
    done = tessera(server, "submit", "--time", "2s", "--json", "--", "sleep", "300")
    assert done.returncode == 0, done.stderr
    workload_id = json.loads(done.stdout)["id"]
    ended = _ended(server, workload_id)
    assert ended["state"] == "failed" and ended["reason"] == "walltime 2s exceeded", ended
    assert "reason: walltime 2s exceeded" in tessera(server, "show", str(workload_id)).stdout


def test_array_dependency_hold_release_and_cancel_by_name(server: LiveServer, tmp_path: Path) -> None:
    script = 'echo "index $TESSERA_ARRAY_INDEX of $SLURM_ARRAY_JOB_ID run $RUN mode $MODE"'
    done = tessera(server, "submit", "--array", "0-4:2", "--export", "RUN", "--env", "MODE=fast", "--json",
                   "--", "sh", "-c", script)  # fmt: skip
    assert done.returncode == 0, done.stderr
    array_id = json.loads(done.stdout)["array_id"]
    tasks = json.loads(tessera(server, "jobs", "--all", "--array", str(array_id), "--json").stdout)
    assert [t["array_index"] for t in tasks] == [0, 2, 4]
    for task in tasks:
        assert _ended(server, task["id"])["state"] == "succeeded"
        out = tessera(server, "logs", str(task["id"])).stdout
        assert out == f"index {task['array_index']} of {array_id} run r7 mode fast\n"

    first = json.loads(tessera(server, "submit", "--hold", "--json", "--", "true").stdout)
    after = json.loads(tessera(server, "submit", "-d", f"afterok:{first['id']}", "--json", "--", "true").stdout)
    time.sleep(1.0)  # a few steps: both still wait
    assert _show(server, first["id"])["reason"].startswith("held")
    assert _show(server, after["id"])["reason"] == f"waiting for dependency afterok:{first['id']}: workload " + (
        f"{first['id']} (pending)"
    )
    released = tessera(server, "release", str(first["id"]))
    assert released.returncode == 0 and released.stdout == f"workload {first['id']}: released (pending)\n"
    assert _ended(server, after["id"])["state"] == "succeeded"

    ids = [json.loads(tessera(server, "submit", "--name", "sweep-x", "--hold", "--json", "--", "true").stdout)["id"]
           for _ in range(2)]  # fmt: skip
    cancelled = tessera(server, "cancel", "--name", "sweep-x")
    assert cancelled.returncode == 0, cancelled.stderr
    assert cancelled.stdout == "".join(f"workload {i}: cancelled\n" for i in ids)
    assert tessera(server, "cancel", "--name", "sweep-x").stdout == "no workload matches: nothing cancelled\n"


def test_a_directory_missing_at_launch_fails_the_job_saying_so(server: LiveServer, tmp_path: Path) -> None:
    gone = tmp_path / "removed"
    done = tessera(server, "submit", "--chdir", str(gone), "--json", "--", "true")
    assert done.returncode == 0, done.stderr  # checked at launch: the server's host may differ from the submitter's
    ended = _ended(server, json.loads(done.stdout)["id"])
    assert ended["state"] == "failed", ended
    assert ended["reason"] == f"could not start: the workload's directory does not exist: {gone}"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--time", "2 hours"), "error: --time: '2 hours' is not a duration: use 2h, 90m, 45s, 1:30:00 or seconds\n"),
        (("--array", "5-1"), "error: --array: '5-1': a range goes up, by a step of at least 1\n"),
        (
            ("--dependency", "after:3"),
            "error: --dependency: 'after' is not a dependency type: use afterok, "
            "afterany, afternotok (e.g. afterok:12)\n",
        ),  # fmt: skip
        (("--env", "NOEQUALS"), "error: --env: 'NOEQUALS': expected NAME=value, NAME made of letters, digits and _\n"),
        (("--export", "NOT_SET_HERE"), "error: --export: NOT_SET_HERE is not set in this environment\n"),
        (("--dependency", "afterok:999999"), "error: dependency: no workload 999999\n"),
    ],
)
def test_bad_job_flags_are_one_line_and_exit_2(server: LiveServer, args: tuple[str, ...], message: str) -> None:
    done = tessera(server, "submit", *args, "--", "true")
    assert (done.returncode, done.stderr) == (2, message)


def test_cancel_and_hold_report_each_id(server: LiveServer) -> None:
    done = tessera(server, "cancel")
    assert done.returncode == 2 and done.stderr.startswith("error: nothing to cancel")
    running = json.loads(tessera(server, "submit", "--json", "--", "sleep", "300").stdout)["id"]
    wait_for(lambda: _show(server, running)["state"] == "running")
    held = tessera(server, "hold", str(running), "999999")
    assert held.returncode == 2
    assert held.stderr == (
        f"error: workload {running}: workload {running} is running: only a pending one is held\n"
        "error: workload 999999: no workload 999999\n"
    )
    stopped = tessera(server, "cancel", "--state", "running")
    assert f"workload {running}: stopping (running)\n" in stopped.stdout
    assert _ended(server, running)["state"] == "cancelled"
