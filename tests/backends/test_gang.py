"""A gang (``LaunchSpec.gang``) on the local backend, with real processes: one process per rank under one
supervisor, torchrun's variables, one log per rank, the first failure stopping the others, a stop ending every rank,
re-adoption of the whole gang by a new backend, and ranks run as their tenant's user."""

from __future__ import annotations

import os
import pwd
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_containment import tenant_accounts  # noqa: F401  (a fixture)
from test_local_backend import is_running, wait_for_exit, wait_for_exits, wait_until

from tessera.backends.accounts import TenantAccounts, user_name
from tessera.backends.base import ExitStatus, GangRanks, LaunchSpec, rank_log_path
from tessera.backends.local import LocalBackend

pytestmark = pytest.mark.e2e

# Each rank prints its variables, then writes its pid and waits until the file `go` exists (or forever).
PRINT_ENV = (
    'for v in WORLD_SIZE RANK LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT; do eval "echo $v=\\$$v"; done'
)
WAIT_FOR_GO = f"{PRINT_ENV}; echo $$ > rank$RANK.pid; while [ ! -e go ]; do sleep 0.02; done"
# Rank 1 fails with 3 once rank 0 is ready; rank 0 says that SIGTERM came and exits with 143.
ONE_FAILS = (
    'if [ "$RANK" = 1 ]; then while [ ! -e rank0.ready ]; do sleep 0.02; done; echo failing; exit 3; fi; '
    'trap "echo SIGTERM came; exit 143" TERM; touch rank0.ready; while :; do sleep 0.02; done'
)


@pytest.fixture
def backend(tmp_path: Path) -> Iterator[LocalBackend]:
    local = LocalBackend(tmp_path / "run")
    yield local
    for workload_id in local.tracked():  # a failed test must not leave processes behind
        local.stop(workload_id, grace_s=0)
    local.close()


def gang_of(script: str, log: Path, gang: GangRanks, **fields: object) -> LaunchSpec:
    return LaunchSpec("g", ("sh", "-c", script), log_path=log, workdir=log.parent, gang=gang, **fields)  # type: ignore[arg-type]


def variables(path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)


def rank_pids(workdir: Path, ranks: tuple[int, ...]) -> list[int]:
    wait_until(
        lambda: all((workdir / f"rank{r}.pid").is_file() and (workdir / f"rank{r}.pid").read_text() for r in ranks)
    )
    return [int((workdir / f"rank{r}.pid").read_text()) for r in ranks]


def test_each_rank_runs_with_torchruns_variables_and_logs_apart(backend: LocalBackend, tmp_path: Path) -> None:
    log = tmp_path / "w.log"
    backend.launch(gang_of(f"{PRINT_ENV}; echo only rank $RANK here >&2", log, GangRanks(2, (0, 1))))
    assert wait_for_exit(backend, "g") == ExitStatus("g", 0)
    ranks = [variables(rank_log_path(log, r)) for r in (0, 1)]
    assert [v["RANK"] for v in ranks] == ["0", "1"] and [v["LOCAL_RANK"] for v in ranks] == ["0", "1"]
    assert {v["WORLD_SIZE"] for v in ranks} == {v["LOCAL_WORLD_SIZE"] for v in ranks} == {"2"}
    assert {v["MASTER_ADDR"] for v in ranks} == {"127.0.0.1"}
    port = ranks[0]["MASTER_PORT"]
    assert ranks[1]["MASTER_PORT"] == port and int(port) > 0  # picked once by the supervisor, for every rank
    assert "only rank 0 here" in log.read_text() and "rank 1" not in log.read_text()
    assert "only rank 1 here" in rank_log_path(log, 1).read_text()  # stderr too
    main, rank1 = log.stat(), rank_log_path(log, 1).stat()
    assert (rank1.st_uid, rank1.st_mode) == (main.st_uid, main.st_mode) and oct(main.st_mode & 0o777) == "0o600"


def test_a_launch_without_rank_0_logs_each_rank_apart_and_uses_the_given_port(
    backend: LocalBackend, tmp_path: Path
) -> None:
    log = tmp_path / "w.log"
    gang = GangRanks(4, (2, 3), master_addr="127.0.0.1", master_port=29512)
    backend.launch(gang_of(PRINT_ENV, log, gang))
    assert wait_for_exit(backend, "g") == ExitStatus("g", 0)
    ranks = [variables(rank_log_path(log, r)) for r in (2, 3)]
    assert [(v["RANK"], v["LOCAL_RANK"]) for v in ranks] == [("2", "0"), ("3", "1")]
    assert {(v["WORLD_SIZE"], v["LOCAL_WORLD_SIZE"], v["MASTER_PORT"]) for v in ranks} == {("4", "2", "29512")}
    assert "RANK" not in log.read_text()  # the main log holds only what the supervisor says


def test_the_first_rank_that_fails_stops_the_others_and_gives_its_exit_code(
    backend: LocalBackend, tmp_path: Path
) -> None:
    log = tmp_path / "w.log"
    backend.launch(gang_of(ONE_FAILS, log, GangRanks(2, (0, 1))))
    assert wait_for_exit(backend, "g") == ExitStatus("g", 3)  # the first failure's, not rank 0's 143
    text = log.read_text()
    assert "rank 1 exited with code 3: stopping the other ranks" in text
    assert "SIGTERM came" in text  # rank 0 was stopped with SIGTERM (it would have run forever)
    assert "failing" in rank_log_path(log, 1).read_text()


def test_a_rank_that_ignores_sigterm_is_killed_after_the_grace(backend: LocalBackend, tmp_path: Path) -> None:
    log = tmp_path / "w.log"
    script = ONE_FAILS.replace('trap "echo SIGTERM came; exit 143" TERM', "trap '' TERM")
    backend.launch(gang_of(script, log, GangRanks(2, (0, 1))))
    assert wait_for_exits(backend, "g", timeout_s=30) == {"g": ExitStatus("g", 3)}
    assert "did not stop within" in log.read_text()


def test_a_gang_whose_command_cannot_start_gives_127(backend: LocalBackend, tmp_path: Path) -> None:
    log = tmp_path / "w.log"
    spec = LaunchSpec("g", ("no-such-command-for-tessera",), log_path=log, gang=GangRanks(2, (0, 1)))
    backend.launch(spec)
    assert wait_for_exit(backend, "g") == ExitStatus("g", 127)
    assert "command not found" in log.read_text() and "rank 0 exited with code 127" in log.read_text()
    assert rank_log_path(log, 1).read_text() == ""  # made at the launch; rank 1 was never started


def test_stop_ends_every_rank_and_leaves_nothing(backend: LocalBackend, tmp_path: Path) -> None:
    log = tmp_path / "w.log"
    handle = backend.launch(gang_of(WAIT_FOR_GO, log, GangRanks(3, (0, 1, 2))))
    pids = rank_pids(tmp_path, (0, 1, 2))
    assert set(pids) <= set(backend.pids(handle))  # every rank is one of the workload's processes
    backend.stop("g", grace_s=5.0)
    status = wait_for_exit(backend, "g")
    assert status.exit_code is not None and status.exit_code != 0
    assert not any(is_running(pid) for pid in pids) and backend.pids(handle) == []
    assert "stopping the other ranks" not in log.read_text()  # a stop from outside is not a rank's failure


def test_stop_right_after_the_launch_of_a_gang(backend: LocalBackend, tmp_path: Path) -> None:
    handle = backend.launch(gang_of("echo started; sleep 1000", tmp_path / "w.log", GangRanks(4, (0, 1, 2, 3))))
    backend.stop("g", grace_s=30)  # before, while or after the ranks are started: each ends by that SIGTERM
    assert wait_for_exit(backend, "g").exit_code == -15
    assert not is_running(int(str(handle.data["pid"]))) and backend.pids(handle) == []


def test_a_new_backend_adopts_a_running_gang_and_reports_its_end(tmp_path: Path) -> None:
    log = tmp_path / "w.log"
    first = LocalBackend(tmp_path / "run")
    first.launch(gang_of(WAIT_FOR_GO, log, GangRanks(2, (0, 1))))
    pids = rank_pids(tmp_path, (0, 1))
    first.close()  # the server is gone; the gang runs on
    second = LocalBackend(tmp_path / "run")
    try:
        handle = second.find("g")
        assert handle is not None
        second.adopt(handle)
        assert set(pids) <= set(second.pids(handle)) and second.poll() == []
        (tmp_path / "go").touch()
        assert wait_for_exit(second, "g") == ExitStatus("g", 0)
        assert not any(is_running(pid) for pid in pids)
    finally:
        for workload_id in second.tracked():
            second.stop(workload_id, grace_s=0)
        second.close()


def test_the_ranks_run_as_their_tenants_user(
    tmp_path: Path,
    tenant_accounts: TenantAccounts,  # noqa: F811
) -> None:
    tenant = f"t{uuid.uuid4().hex[:8]}"
    backend = LocalBackend(tmp_path / "run", accounts=tenant_accounts)
    log = tmp_path / "logs" / "w.log"
    try:
        script = 'echo "rank $RANK uid $(id -u)"'
        backend.launch(LaunchSpec("g", ("sh", "-c", script), log_path=log, tenant=tenant, gang=GangRanks(2, (0, 1))))
        assert wait_for_exit(backend, "g").exit_code == 0
    finally:
        backend.close()
    uid = pwd.getpwnam(user_name(tenant)).pw_uid
    assert uid != 0
    assert f"rank 0 uid {uid}" in log.read_text() and f"rank 1 uid {uid}" in rank_log_path(log, 1).read_text()
    for path in (log, rank_log_path(log, 1)):  # the server's, as every log: no tenant reads them directly
        assert path.stat().st_uid == os.geteuid() and path.stat().st_mode & 0o777 == 0o600
