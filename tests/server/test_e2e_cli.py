"""The CLI against a real ``tessera up``: JSON outputs a script can rely on, tokens per tenant, and bad input as one
line naming the file, line and field, exit code 2, no traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from live_server import ADMIN, LiveServer, wait_for

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    live = LiveServer(tmp_path_factory.mktemp("cli") / "data", gpus="2xA100-80GB")
    live.start()
    yield live
    live.cancel_all()
    live.stop()


def tessera(
    server: LiveServer, *args: str, token: str = ADMIN, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    env = {"TESSERA_URL": server.url, "TESSERA_TOKEN": token, "PATH": "/usr/bin:/bin", "HOME": "/nonexistent"}
    paths = [os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if paths:  # the code under test, not another checkout installed in the environment
        env["PYTHONPATH"] = os.pathsep.join(paths)
    return subprocess.run(
        [sys.executable, "-m", "tessera.cli", *args], capture_output=True, text=True, env=env, timeout=60, cwd=cwd
    )


def test_submit_show_jobs_cancel_as_json(server: LiveServer) -> None:
    done = tessera(server, "submit", "--gpu-fraction", "0.25", "--name", "quick", "--json", "--", "echo", "hi")
    assert done.returncode == 0, done.stderr
    created = json.loads(done.stdout)
    assert created["state"] == "pending" and created["gpu_milli"] == 250

    slow = json.loads(tessera(server, "submit", "--gpus", "1", "--json", "--", "sleep", "300").stdout)
    shown = wait_for(
        lambda: json.loads(tessera(server, "show", str(slow["id"]), "--json").stdout)["state"] == "running"
    )
    assert shown
    listed = json.loads(tessera(server, "jobs", "--json").stdout)
    assert slow["id"] in [w["id"] for w in listed]
    assert tessera(server, "cancel", str(slow["id"])).returncode == 0
    final = wait_for(
        lambda: (
            (w := json.loads(tessera(server, "show", str(slow["id"]), "--json").stdout))["state"] in ("cancelled",)
            and w
        )
    )
    assert final["state"] == "cancelled"
    quick = wait_for(
        lambda: (
            (w := json.loads(tessera(server, "show", str(created["id"]), "--json").stdout))["state"] == "succeeded"
            and w
        )
    )
    assert quick["exit_code"] == 0
    assert tessera(server, "logs", str(created["id"])).stdout == "hi\n"
    table = tessera(server, "jobs", "--all").stdout
    assert "quick" in table and "succeeded" in table


def test_tenant_token_scopes_what_the_cli_sees(server: LiveServer) -> None:
    created = json.loads(tessera(server, "token", "create", "--tenant", "team-x", "--json").stdout)
    mine = json.loads(tessera(server, "submit", "--json", "--", "true", token=created["token"]).stdout)
    assert mine["queue"] == "team-x"
    other = json.loads(tessera(server, "token", "create", "--tenant", "team-y", "--json").stdout)["token"]
    hidden = tessera(server, "show", str(mine["id"]), token=other)
    assert hidden.returncode == 2 and hidden.stderr == f"error: no workload {mine['id']}\n"
    assert json.loads(tessera(server, "jobs", "--json", "--all", token=other).stdout) == []
    denied = tessera(server, "jobs", token="wrong")
    assert denied.returncode == 2 and "missing or invalid token" in denied.stderr


def test_global_options_before_the_command_and_what_a_new_user_tripped_on(server: LiveServer) -> None:
    """Issue 25: ``tessera --token X jobs`` was refused; ``--gpu-type`` without ``--gpus`` gave a CPU-only workload;
    ``jobs --queue nope`` was an empty table with exit 0."""
    created = json.loads(tessera(server, "token", "create", "--tenant", "team-g", "--json").stdout)
    mine = json.loads(tessera(server, "submit", "--json", "--", "true", token=created["token"]).stdout)
    before = tessera(server, "--token", created["token"], "jobs", "--json", "--all", token="not-this-one")
    assert before.returncode == 0, before.stderr
    assert [w["id"] for w in json.loads(before.stdout)] == [mine["id"]]  # the tenant's view: the token before won
    typed = json.loads(tessera(server, "submit", "--json", "--gpu-type", "A100", "--hold", "--", "true").stdout)
    assert typed["gpus"] == 1 and "A100-80GB" in typed["gpu_types"]  # one GPU, not a CPU-only workload
    unknown = tessera(server, "jobs", "--queue", "nope")
    assert unknown.returncode == 2 and unknown.stderr.startswith("error: --queue: no queue 'nope' (yours: ")
    assert tessera(server, "jobs", "--queue", "team-g", token=created["token"]).returncode == 0


def test_tokens_are_listed_without_secrets_and_revoked(server: LiveServer) -> None:
    created = json.loads(tessera(server, "token", "create", "--tenant", "team-r", "--label", "ci", "--json").stdout)
    assert tessera(server, "jobs", token=created["token"]).returncode == 0
    listed = tessera(server, "token", "list", "--json")
    assert listed.returncode == 0 and created["token"] not in listed.stdout and ADMIN not in listed.stdout
    (mine,) = [t for t in json.loads(listed.stdout) if t["tenant"] == "team-r"]
    assert mine["label"] == "ci" and mine["last_used_at"] is not None
    table = tessera(server, "token", "list").stdout
    assert "team-r" in table and "ci" in table
    assert tessera(server, "token", "list", token=created["token"]).returncode == 2  # admin only
    revoked = tessera(server, "token", "revoke", str(mine["id"]))
    assert revoked.returncode == 0 and revoked.stdout == f"token {mine['id']} (tenant team-r) revoked\n"
    after = tessera(server, "jobs", token=created["token"])
    assert after.returncode == 2 and "missing or invalid token" in after.stderr
    again = tessera(server, "token", "revoke", str(mine["id"]))
    assert again.returncode == 2 and again.stderr == f"error: no token {mine['id']}\n"


def test_bad_input_is_one_line_naming_file_line_and_field(server: LiveServer, tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text("name: trainer\ncommand: [python, train.py]\ngpus: 1\ngpu_fraction: 1.5\n")
    result = tessera(server, "submit", "-f", str(spec))
    assert result.returncode == 2
    assert result.stderr.startswith(f"error: {spec}:4: gpu_fraction: ")
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr

    spec.write_text("command: [python, train.py]\ngpus: 1\ngpu_types: [X100]\n")
    result = tessera(server, "submit", "-f", str(spec))
    assert result.returncode == 2 and result.stderr.startswith(f"error: {spec}:3: gpu_types: unknown GPU")

    spec.write_text("command: [python\n")
    result = tessera(server, "submit", "-f", str(spec))
    assert result.returncode == 2 and result.stderr.startswith(f"error: {spec}:2: ")

    result = tessera(server, "submit", "--gpus", "-1", "--", "true")
    assert result.returncode == 2 and result.stderr.startswith("error: gpus: ")
    result = tessera(server, "submit", "--queue", "nope", "--", "true")
    assert result.returncode == 2 and result.stderr.startswith("error: queue: unknown queue 'nope'")
    result = tessera(server, "submit", "--gpus", "4", "--", "true")
    assert result.returncode == 2 and "largest node has 2" in result.stderr
    result = tessera(server, "submit", "--gpus", "1")
    assert result.returncode == 2 and result.stderr.startswith("error: command: nothing to run")


@pytest.mark.parametrize(
    ("args", "start"),
    [
        (("--workers", "0"), "error: workers: "),
        (("--workers", "3", "--gpus", "1"), "error: workers: 3 workers of this size never fit at once"),
        (("--elastic", "1-4", "--workers", "5", "--gpus", "1"), "error: workers: 5 is outside the elastic range"),
        (("--job-type", "GPT-17", "--gpus", "1"), "error: job_type: unknown job type 'GPT-17' (known: A3C, "),
        (("--elastic", "4-2"), "error: --elastic: the minimum 4 is above the maximum 2"),
    ],
)
def test_bad_job_shapes_are_one_line_exit_2(server: LiveServer, args: tuple[str, ...], start: str) -> None:
    result = tessera(server, "submit", *args, "--", "true")
    assert result.returncode == 2 and result.stderr.startswith(start), result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr


def test_unreachable_server_is_one_line(tmp_path: Path) -> None:
    dead = LiveServer(tmp_path)  # never started: nothing listens on its port
    result = tessera(dead, "jobs")
    assert result.returncode == 2
    assert result.stderr.startswith(f"error: cannot reach the Tessera server at {dead.url}")
    assert result.stderr.count("\n") == 1


def test_a_gang_submitted_from_the_cli_shows_its_shape_and_rank_logs(server: LiveServer) -> None:
    script = 'echo "rank $RANK of $WORLD_SIZE"'
    args = ("--workers", "2", "--gpus", "1", "--job-type", "resnet-50", "--checkpointable", "--json")
    created = json.loads(tessera(server, "submit", *args, "--", "sh", "-c", script).stdout)
    assert (created["workers_asked"], created["job_type"], created["checkpointable"]) == (2, "ResNet-50", True)
    with server.client() as client:
        wait_for(lambda: client.workload(created["id"])["state"] == "succeeded", timeout_s=30)
    shown = tessera(server, "show", str(created["id"]))
    assert "workers: 2 (a gang: tessera logs --rank R), job type ResNet-50, checkpointable" in shown.stdout
    rank1 = tessera(server, "logs", str(created["id"]), "--rank", "1")
    assert rank1.returncode == 0 and "rank 1 of 2" in rank1.stdout
