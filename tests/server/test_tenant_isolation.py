"""Issue 17's acceptance test for host isolation, through a real ``tessera up``: a tenant's workload tries to read the
admin token (the server's command line and environment), the store, another tenant's log and the server's
environment, and fails at each. As root the workloads run as per-tenant OS users; a server that is not root (run as
``nobody`` with ``setpriv``) still gives them a clean environment and keeps its secrets off its command line."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from live_server import ADMIN, LiveServer, wait_for

from tessera.backends.accounts import user_name

pytestmark = pytest.mark.e2e

# Each probe prints "READ <what>" or "DENIED <what>"; what could be read is printed too, for the secrets check.
ATTACK = r"""
server=$1 data=$2 victim_log=$3
probe() {
  what=$1; shift
  if out=$("$@" 2>/dev/null); then echo "READ $what"; printf '%s\n' "$out"; else echo "DENIED $what"; fi
}
echo "uid $(id -u)"
echo "cmdline: $(tr '\0' ' ' < /proc/$server/cmdline)"
probe environ cat /proc/$server/environ
probe store cat $data/tessera.db
probe store-wal cat $data/tessera.db-wal
probe data-dir ls $data
probe logs-dir ls $data/logs
probe victim-log cat $victim_log
probe runs-dir ls $data/runs
probe signal-server kill -0 $server
echo "--- my environment"
env
"""
PROBES = ("environ", "store", "data-dir", "logs-dir", "victim-log", "runs-dir", "signal-server")


def _submit_and_wait(server: LiveServer, token: str, command: list[str], env: dict[str, str]) -> int:
    with server.client(token) as client:
        workload_id = int(client.submit({"command": command, "env": env})["id"])
        wait_for(lambda: client.workload(workload_id)["state"] in ("succeeded", "failed"), timeout_s=60)
        return workload_id


def _log(server: LiveServer, workload_id: int) -> str:
    with server.client() as client:
        return str(client.logs(workload_id)["data"])


@pytest.fixture
def data_dir() -> Iterator[Path]:
    # Not pytest's tmp_path: its parents are 0700, so tenants' users could not reach their homes inside.
    path = Path(tempfile.mkdtemp(prefix="tessera-iso-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="per-tenant OS users need a root server")
def test_a_tenants_workload_cannot_read_the_token_the_store_other_logs_or_the_server_env(data_dir: Path) -> None:
    server = LiveServer(data_dir, run_as="tenant-users")
    tenants = [f"iso{uuid.uuid4().hex[:8]}" for _ in range(2)]
    server.start()
    try:
        assert server.process is not None
        with server.client() as admin:
            attacker, victim = (str(admin.create_token(t)["token"]) for t in tenants)
        secret_job = ["sh", "-c", 'echo "victim log line $VICTIM_SECRET"']
        victim_id = _submit_and_wait(server, victim, secret_job, {"VICTIM_SECRET": "v-" + uuid.uuid4().hex})
        assert "victim log line v-" in _log(server, victim_id)
        victim_log = data_dir / "logs" / f"{victim_id}.log"
        command = ["bash", "-c", ATTACK, "attack", str(server.process.pid), str(data_dir), str(victim_log)]
        attack_id = _submit_and_wait(server, attacker, command, {"MINE": "1"})
        text = _log(server, attack_id)
        uids = [pwd.getpwnam(user_name(t)).pw_uid for t in tenants]
    finally:
        server.cancel_all()
        server.stop()
        for tenant in tenants:
            subprocess.run(["userdel", user_name(tenant)], capture_output=True, check=False)
    lines = text.splitlines()
    assert lines[0] == f"uid {uids[0]}" and 0 not in uids and uids[0] != uids[1]  # its own unprivileged user
    assert lines[1].startswith("cmdline: ") and "tessera.cli up" in lines[1]  # it read the command line ...
    for probe in PROBES:
        assert f"DENIED {probe}" in lines, (probe, text)  # ... and was refused everything else
    assert ADMIN not in text  # not on the command line, not in its environment
    assert "victim log line" not in text and "VICTIM_SECRET" not in text
    environment = lines[lines.index("--- my environment") + 1 :]
    names = {line.split("=", 1)[0] for line in environment if "=" in line}
    assert "MINE" in names and not {"TESSERA_ADMIN_TOKEN", "TESSERA_DB", "PYTHONPATH"} & names


def _as_nobody() -> list[str]:
    """The command prefix that runs a program as ``nobody``; skips the test where ``nobody`` cannot run this Python
    (e.g. an interpreter under /root, 0700: setpriv execs it still holding root's capabilities, the server's own
    launches then fail)."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to start a server as nobody")
    nobody = pwd.getpwnam("nobody")
    drop = ["setpriv", f"--reuid={nobody.pw_uid}", f"--regid={nobody.pw_gid}", "--clear-groups", "--"]
    again = "import subprocess, sys; subprocess.run([sys.executable, '-c', 'pass'], check=True)"
    if subprocess.run([*drop, sys.executable, "-c", again], capture_output=True, check=False).returncode != 0:
        pytest.skip(f"nobody cannot run {sys.executable}")
    return drop


def test_a_server_that_is_not_root_says_so_and_still_cleans_the_environment(data_dir: Path) -> None:
    drop = _as_nobody()
    nobody = pwd.getpwnam("nobody")
    os.chown(data_dir, nobody.pw_uid, nobody.pw_gid)
    server = LiveServer(data_dir, run_as="auto", prefix=tuple(drop))
    server.start()
    try:
        with server.client() as admin:
            token = str(admin.create_token(f"iso{uuid.uuid4().hex[:8]}")["token"])
        workload_id = _submit_and_wait(server, token, ["sh", "-c", "id -u; env"], {"MINE": "1"})
        text = _log(server, workload_id)
        assert server.process is not None
        cmdline = (Path("/proc") / str(server.process.pid) / "cmdline").read_bytes().decode()
    finally:
        server.cancel_all()
        server.stop()
    assert text.splitlines()[0] == str(nobody.pw_uid)
    assert ADMIN not in text and "TESSERA_ADMIN_TOKEN" not in text and "MINE=1" in text
    server_log = (data_dir / "server.log").read_text()
    assert "not running as root: workloads run as nobody" in server_log
    assert "tessera.cli" in cmdline and ADMIN not in cmdline
