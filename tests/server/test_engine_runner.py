"""Which interpreter runs a replica's engine shim as a tenant's OS user (issue 25, defect 7): as root the project's
virtualenv often links to an interpreter under /root (0700), which tenants' users cannot run, and a sim model never
became ready. ``EngineRunner`` finds one they can run (tried as ``nobody``), or says at once why there is none."""

from __future__ import annotations

import os
import pwd
import site
import subprocess
from pathlib import Path

import pytest

from tessera.server import engine_runner
from tessera.server.engine_runner import EngineRunner, RunnerUnreachable, package_path

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(os.geteuid() != 0, reason="runs probes as nobody: needs root")]


def test_the_interpreter_found_imports_the_sim_engine_as_an_unprivileged_user() -> None:
    runner = EngineRunner(check_unprivileged=True)
    python = runner.python()
    nobody = pwd.getpwnam("nobody")
    done = subprocess.run(
        [python, "-c", "import tessera.serving.engines.sim_server"],
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": os.pathsep.join(runner.path)}, cwd="/", capture_output=True,
        user=nobody.pw_uid, group=nobody.pw_gid, extra_groups=[], timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert runner.python() == python  # found once


def test_with_no_interpreter_that_can_import_tessera_it_fails_fast_saying_why() -> None:
    runner = EngineRunner(check_unprivileged=True, tried=["/usr/bin/python3", "/nonexistent/python3"])
    runner.path = ["/nonexistent-tessera"]  # nothing can import Tessera from there
    with pytest.raises(RunnerUnreachable, match="No module named 'tessera'") as raised:
        runner.python()
    assert "/nonexistent/python3: [Errno 2] No such file" in str(raised.value)
    assert "TESSERA_ENGINE_RUNNER_PYTHON" in str(raised.value) and "--run-as server" in str(raised.value)
    with pytest.raises(RunnerUnreachable):
        runner.python()  # the verdict is kept: no new probes per replica


def test_a_server_that_runs_workloads_as_itself_needs_no_probe() -> None:
    assert EngineRunner(check_unprivileged=False).python() == __import__("sys").executable


def test_the_replicas_path_has_the_servers_packages_but_no_directory_others_may_write(tmp_path: Path) -> None:
    """A GPU machine's packages came through PYTHONPATH (a bundle in /tmp/site): the replicas need them too. A
    directory everyone may write to (/tmp) would let a tenant plant a module in another tenant's replica."""
    mine, shared = tmp_path / "site", tmp_path / "shared"
    mine.mkdir(mode=0o755)
    shared.mkdir()
    shared.chmod(0o1777)
    path = package_path({"PYTHONPATH": os.pathsep.join([str(mine), str(shared), "/nonexistent"])})
    assert str(mine) in path and str(shared) not in path and "/nonexistent" not in path
    assert os.getcwd() not in path[1:] or os.getcwd() in site.getsitepackages()


def test_a_search_that_found_none_is_made_again_later_not_never() -> None:
    """One tenant's fork bomb at the moment of the first replica start must not leave every model failing until the
    server restarts: the verdict 'none' expires."""
    runner = EngineRunner(check_unprivileged=True, tried=["/nonexistent/python3"])
    with pytest.raises(RunnerUnreachable):
        runner.python()
    runner.tried = ["/usr/bin/python3"]  # e.g. the host recovered, or the operator installed one
    with pytest.raises(RunnerUnreachable):
        runner.python()  # not before RETRY_S
    runner._failed_at -= engine_runner.RETRY_S
    assert runner.python() == "/usr/bin/python3"
