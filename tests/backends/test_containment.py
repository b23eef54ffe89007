"""Containment and host isolation of the local backend, with real processes: whatever a workload starts ends with it
(``setsid``, a double fork, ``nohup``, a daemon), under each cgroup kind this kernel offers and under the forced
subreaper fallback ("none"); the command gets a clean environment and the tenant's ``env`` cannot reach the
supervisor; with tenant accounts (root only) the command runs as its tenant's OS user and cannot read other logs."""

from __future__ import annotations

import os
import pwd
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_local_backend import is_running, pid_of, wait_for_exit, wait_until

from tessera.backends import cgroups
from tessera.backends.accounts import TenantAccounts, user_name
from tessera.backends.base import LaunchSpec
from tessera.backends.local import LocalBackend

pytestmark = pytest.mark.e2e

KINDS = [*cgroups.KINDS, "none"]

# Four ways to leave the process group or the parent: each writes the pid of a process meant to outlive CMD.
ESCAPES = """
setsid sleep 300 & echo $! > setsid.pid
( sleep 301 & echo $! > double.pid ) &
nohup sleep 302 > /dev/null 2>&1 & echo $! > nohup.pid
( setsid sh -c 'sleep 303 & echo $! > daemon.pid; exec sleep 304' & ) &
for f in setsid double nohup daemon; do while [ ! -s $f.pid ]; do sleep 0.01; done; done
"""
ESCAPED = ("setsid", "double", "nohup", "daemon")


def _backend(tmp_path: Path, kind: str, **kwargs: object) -> LocalBackend:
    try:
        return LocalBackend(tmp_path / "run", containment=kind, **kwargs)  # type: ignore[arg-type]
    except OSError as error:
        pytest.skip(f"containment {kind} not usable here: {error}")


@pytest.fixture(params=KINDS)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LocalBackend]:
    local = _backend(tmp_path, request.param)
    yield local
    for workload_id in local.tracked():
        local.stop(workload_id, grace_s=0)
    local.close()


def _escaped_pids(workdir: Path) -> list[int]:
    pids = [int((workdir / f"{name}.pid").read_text()) for name in ESCAPED]
    assert all(pid > 0 for pid in pids)
    return pids


def _spec(workload_id: str, script: str, tmp_path: Path, **env: str) -> LaunchSpec:
    return LaunchSpec(
        workload_id, ("sh", "-c", script), env=env, log_path=tmp_path / f"{workload_id}.log", workdir=tmp_path
    )


def test_what_a_workload_started_ends_when_it_succeeds(backend: LocalBackend, tmp_path: Path) -> None:
    backend.launch(_spec("w", ESCAPES + "exit 0", tmp_path))
    assert wait_for_exit(backend, "w").exit_code == 0
    for pid in _escaped_pids(tmp_path):
        assert not is_running(pid), f"{pid} outlived its workload"
    cgroup = backend.exec.cgroup("w")
    assert cgroup is None or not cgroup.exists()  # removed once empty


def test_what_a_workload_started_ends_when_it_fails_or_is_stopped(backend: LocalBackend, tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    backend.launch(_spec("failed", ESCAPES + "exit 3", tmp_path / "a"))
    backend.launch(_spec("stopped", ESCAPES + "echo ready; sleep 300", tmp_path / "b"))
    assert wait_for_exit(backend, "failed").exit_code == 3
    wait_until(lambda: "ready" in (tmp_path / "b" / "stopped.log").read_text())
    escaped = _escaped_pids(tmp_path / "b")
    assert all(is_running(pid) for pid in escaped)
    assert set(escaped) <= set(backend.pids(backend.find("stopped") or pytest.fail("no handle"))) or (
        backend.exec.cgroups is None  # without a cgroup, pids() sees the process group only
    )
    backend.stop("stopped", grace_s=0.5)
    assert wait_for_exit(backend, "stopped").exit_code == -signal.SIGTERM
    for pid in [*_escaped_pids(tmp_path / "a"), *escaped]:
        assert not is_running(pid), f"{pid} outlived its workload"


def test_a_killed_supervisor_leaves_nothing_behind_with_a_cgroup(backend: LocalBackend, tmp_path: Path) -> None:
    if backend.exec.cgroups is None:
        pytest.skip("the subreaper fallback cannot contain orphans of a SIGKILLed supervisor (documented limit)")
    handle = backend.launch(_spec("w", ESCAPES + "echo ready; sleep 300", tmp_path))
    wait_until(lambda: "ready" in (tmp_path / "w.log").read_text())
    escaped = _escaped_pids(tmp_path)
    os.kill(pid_of(handle), signal.SIGKILL)
    assert wait_for_exit(backend, "w").exit_code == -signal.SIGKILL
    for pid in escaped:
        assert not is_running(pid), f"{pid} outlived its SIGKILLed supervisor"


def test_the_command_gets_a_clean_environment_and_cannot_break_the_supervisor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TESSERA_ADMIN_TOKEN", "server-secret")
    monkeypatch.setenv("TESSERA_DB", "postgresql://u:pw@h/db")
    backend = _backend(tmp_path, "auto")
    (tmp_path / "logging.py").write_text(f"open({str(tmp_path / 'imported')!r}, 'w')\n")  # -P: never imported
    hostile = {"PYTHONHOME": "/nonexistent", "PYTHONPATH": str(tmp_path), "LD_PRELOAD": "/nonexistent/evil.so"}
    try:
        backend.launch(_spec("w", "env; exit 5", tmp_path, MINE="yes", **hostile))
        assert wait_for_exit(backend, "w").exit_code == 5  # written by a supervisor that worked
    finally:
        backend.close()
    env = dict(
        line.split("=", 1)
        for line in (tmp_path / "w.log").read_text().splitlines()
        if "=" in line and "ld.so" not in line
    )
    assert env["MINE"] == "yes" and env["PYTHONHOME"] == "/nonexistent"  # what it asked for
    assert "TESSERA_ADMIN_TOKEN" not in env and "TESSERA_DB" not in env
    base = {"MINE", "PATH", "HOME", "USER", "LOGNAME", "LANG", "PWD", "SHLVL", "_", "TESSERA_RUNTIME_DIR"}
    assert set(env) - set(hostile) <= base
    assert not (tmp_path / "imported").exists()
    assert not backend.spec_path("w").exists()  # read and deleted by the supervisor


@pytest.fixture
def tenant_accounts(tmp_path: Path) -> Iterator[TenantAccounts]:
    if os.geteuid() != 0:
        pytest.skip("tenant accounts need root")
    homes = Path("/tmp") / f"tessera-homes-{uuid.uuid4().hex[:8]}"  # reachable by other users, unlike tmp_path
    accounts = TenantAccounts(homes)
    tenants = [f"t{uuid.uuid4().hex[:8]}" for _ in range(2)]
    accounts.check()
    yield accounts
    for tenant in tenants + list(accounts._known):
        subprocess.run(["userdel", user_name(tenant)], capture_output=True, check=False)
    subprocess.run(["rm", "-rf", str(homes)], check=False)


def test_each_tenant_runs_as_its_own_user_in_its_own_home(tmp_path: Path, tenant_accounts: TenantAccounts) -> None:
    backend = _backend(tmp_path, "auto", accounts=tenant_accounts)
    logs = tmp_path / "logs"
    a, b = (f"t{uuid.uuid4().hex[:8]}" for _ in range(2))
    try:
        backend.launch(LaunchSpec("b", ("sh", "-c", "echo secret of b"), log_path=logs / "b.log", tenant=b))
        assert wait_for_exit(backend, "b").exit_code == 0
        script = f'id -u; pwd; echo "$HOME"; touch "$HOME/mine" && echo wrote; cat {logs / "b.log"} || echo denied'
        backend.launch(LaunchSpec("a", ("sh", "-c", script), log_path=logs / "a.log", tenant=a))
        assert wait_for_exit(backend, "a").exit_code == 0
    finally:
        backend.close()
    user = pwd.getpwnam(user_name(a))
    home = tenant_accounts.homes_dir / user_name(a)
    lines = (logs / "a.log").read_text().splitlines()
    assert lines[:4] == [str(user.pw_uid), str(home), str(home), "wrote"]
    assert user.pw_uid != 0 and user.pw_uid != pwd.getpwnam(user_name(b)).pw_uid
    assert "secret of b" not in "\n".join(lines) and lines[-1] == "denied"
    assert (home / "mine").stat().st_uid == user.pw_uid and home.stat().st_mode & 0o777 == 0o700
    assert (logs / "a.log").stat().st_mode & 0o777 == 0o600 and (logs / "a.log").stat().st_uid == os.geteuid()


def test_a_tenant_user_that_tessera_did_not_make_is_refused(tmp_path: Path, tenant_accounts: TenantAccounts) -> None:
    tenant = f"t{uuid.uuid4().hex[:8]}"
    subprocess.run(["useradd", "--system", "--no-create-home", user_name(tenant)], check=True)
    try:
        with pytest.raises(Exception, match="not made by Tessera"):
            tenant_accounts.account(tenant)
    finally:
        subprocess.run(["userdel", user_name(tenant)], check=False)


def test_supervisor_runs_with_its_own_flags_and_environment(tmp_path: Path) -> None:
    backend = _backend(tmp_path, "none")
    command = backend.exec.command(Path("/x.exit"), Path("/x.spec.json"), ["true"])
    assert command[:6] == [sys.executable, "-s", "-P", "-m", "tessera.backends.supervisor", "--exit-file"]
    assert set(backend.exec.supervisor_env) == {"PATH", "LANG", "PYTHONPATH"}
    time.sleep(0)  # nothing started


def test_a_stop_sent_while_the_supervisor_starts_waits_for_its_relay(tmp_path: Path) -> None:
    """The supervisor starts with SIGTERM blocked until its relay is in place: a stop at once after launch is kept,
    CMD is not started and the exit file says -15 (before, the signal could kill a supervisor still starting)."""
    backend = _backend(tmp_path, "auto")
    try:
        for i in range(5):
            backend.launch(_spec(f"w{i}", "echo started; sleep 300", tmp_path))
            backend.stop(f"w{i}", grace_s=30)
            assert wait_for_exit(backend, f"w{i}").exit_code == -signal.SIGTERM
            assert backend.exit_path(f"w{i}").read_text().strip() == "-15"
    finally:
        backend.close()
