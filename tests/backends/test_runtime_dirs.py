"""A workload's private runtime directory and private network, with real processes: the directory is made at launch,
0700 and its own user's, entered by no other tenant and removed at its end; a workload that asks for a network of its
own (a model replica) listens where nobody on the host's loopback can connect; a base directory someone else made
first is refused."""

from __future__ import annotations

import os
import pwd
import socket
import stat
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from test_containment import tenant_accounts  # noqa: F401 (a fixture)
from test_local_backend import wait_for_exit, wait_until

from tessera.backends import runtime_dirs
from tessera.backends.accounts import TenantAccounts, user_name
from tessera.backends.base import LaunchSpec
from tessera.backends.local import LocalBackend
from tessera.backends.runtime_dirs import RuntimeDirError

pytestmark = pytest.mark.e2e


def test_each_workload_gets_a_private_runtime_directory_that_others_cannot_enter_and_that_goes_with_it(
    tmp_path: Path,
    tenant_accounts: TenantAccounts,  # noqa: F811
) -> None:
    backend = LocalBackend(tmp_path / "run", accounts=tenant_accounts)
    a, b = (f"t{uuid.uuid4().hex[:8]}" for _ in range(2))
    logs = tmp_path / "logs"
    hold = 'echo "$TESSERA_RUNTIME_DIR"; touch "$TESSERA_RUNTIME_DIR/mine" && echo wrote; sleep 300'
    try:
        backend.launch(LaunchSpec("b", ("sh", "-c", hold), log_path=logs / "b.log", tenant=b))
        wait_until(lambda: "wrote" in (logs / "b.log").read_text())
        private = Path((logs / "b.log").read_text().splitlines()[0])
        assert private == backend.runtime_dir("b")
        info = private.stat()
        assert stat.S_IMODE(info.st_mode) == 0o700 and info.st_uid == pwd.getpwnam(user_name(b)).pw_uid
        probe = (
            f"ls {private} && echo LISTED; touch {private}/planted && echo PLANTED; ls {private.parent} && echo BASE"
        )
        backend.launch(LaunchSpec("a", ("sh", "-c", probe), log_path=logs / "a.log", tenant=a))
        assert wait_for_exit(backend, "a").exit_code != 0
        assert not {"LISTED", "PLANTED", "BASE"} & set((logs / "a.log").read_text().split())
        backend.stop("b", grace_s=0)
        wait_for_exit(backend, "b")
        assert not private.exists()  # removed with its workload, and what it put there
    finally:
        backend.close()


def test_a_workload_with_a_network_of_its_own_cannot_be_reached_on_the_hosts_loopback(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path / "run")
    if not backend.private_network():
        pytest.skip("no private network namespaces here (not root)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    listen = f'python3 -c \'import socket,time; s=socket.socket(); s.bind(("127.0.0.1", {port})); s.listen(); '
    listen += 'print("listening", flush=True); time.sleep(300)\''
    try:
        backend.launch(LaunchSpec("r", ("sh", "-c", listen), log_path=tmp_path / "r.log", private_network=True))
        wait_until(lambda: "listening" in (tmp_path / "r.log").read_text())
        with socket.socket() as s, pytest.raises(ConnectionRefusedError):
            s.connect(("127.0.0.1", port))  # the port is open in its namespace, not on the host's loopback
    finally:
        backend.stop("r", grace_s=0)
        wait_for_exit(backend, "r")
        backend.close()


def test_a_base_directory_somebody_else_made_first_is_refused(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to make a directory of another user's")
    planted = tmp_path / "planted"
    planted.mkdir(mode=0o711)
    nobody = pwd.getpwnam("nobody")
    os.chown(planted, nobody.pw_uid, nobody.pw_gid)
    with pytest.raises(RuntimeDirError, match="not a directory of this user's"):
        runtime_dirs._own_directory(planted, 0o711)
    link = tmp_path / "link"
    link.symlink_to(tmp_path)
    with pytest.raises(RuntimeDirError):
        runtime_dirs._own_directory(link, 0o711)


def test_a_replica_is_not_started_without_the_network_it_asked_for_when_the_host_cannot_say(tmp_path: Path) -> None:
    """A probe that could not even run (a host out of processes) is no answer: the launch fails and is retried,
    rather than the replica running on the host's loopback; nothing of it is left behind."""
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    backend = LocalBackend(tmp_path / "run", python="/nonexistent/python3")
    try:
        with pytest.raises(OSError, match="network of its own"):
            backend.launch(LaunchSpec("r", ("true",), private_network=True))
        assert backend.runtime_dir("r") is not None and not backend.runtime_dir("r").exists()  # type: ignore[union-attr]
        assert backend.exec._private_network is None  # asked again next time
    finally:
        backend.close()


NETWORK_PROBE = """
import sys
spawned = []
sys.addaudithook(lambda event, args: spawned.append(args[0]) if event == "subprocess.Popen" else None)
import tessera.backends.supervisor
print("netns imported:", "tessera.backends.netns" in sys.modules)
from tessera.backends import netns
netns.enter_private_network()
print("spawned:", spawned)
"""


def test_a_supervisor_loads_the_network_code_only_when_asked_and_runs_no_program_for_it() -> None:
    """Every supervisor imported netns, and a replica's ran ldconfig (ctypes.util.find_library) in its cgroup to
    find libc, whose symbols are in the process anyway."""
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    done = subprocess.run([sys.executable, "-c", NETWORK_PROBE], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.splitlines() == ["netns imported: False", "spawned: []"]


def test_the_base_goes_with_the_last_backend_that_leaves_it_empty(tmp_path: Path) -> None:
    """Every backend made its base (``/run/tessera/<digest>`` as root) and none removed it: hundreds piled up. Now
    a backend's close removes it when empty; a running workload's directory keeps it for the backend that adopts."""
    first, second = LocalBackend(tmp_path / "run"), LocalBackend(tmp_path / "run")  # one run dir: one base
    base = first.exec.runtime.base if first.exec.runtime is not None else pytest.skip("no runtime directories here")
    try:
        handle = first.launch(LaunchSpec("w", ("sleep", "300"), workdir=tmp_path))
        first.close()
        assert base.is_dir()  # the workload runs on, its directory in the base
        second.adopt(handle)
        second.stop("w", grace_s=0)
        wait_for_exit(second, "w")
    finally:
        second.close()
    assert not base.exists()


def test_a_backend_makes_its_base_again_when_another_one_closed_it(tmp_path: Path) -> None:
    first, second = LocalBackend(tmp_path / "run"), LocalBackend(tmp_path / "run")
    base = first.exec.runtime.base if first.exec.runtime is not None else pytest.skip("no runtime directories here")
    first.close()
    assert not base.exists()
    try:
        second.launch(LaunchSpec("w", ("sh", "-c", 'test -d "$TESSERA_RUNTIME_DIR"'), workdir=tmp_path))
        assert wait_for_exit(second, "w").exit_code == 0
    finally:
        second.close()
    assert not base.exists()
