"""A gang's spec and environment, without processes: ``CommandSpec`` carries ``GangRanks`` through its JSON file and
refuses a malformed one, each rank gets torchrun's variables, and a rank's log is made like the main log."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tessera.backends.base import GangRanks, rank_log_path
from tessera.backends.command_spec import CommandSpec, read_spec
from tessera.backends.gang_ranks import _open_like, rank_env


def test_a_command_spec_with_a_gang_survives_its_json_file(tmp_path: Path) -> None:
    gang = GangRanks(8, (4, 5, 6, 7), master_addr="10.0.0.2", master_port=29500)
    spec = CommandSpec(env={"A": "1"}, groups=(5, 6), limit_cgroups=("/x",), log="/l/w.log", gang=gang)
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec.to_json()))
    assert read_spec(path) == spec and not path.exists()
    assert CommandSpec.from_json(json.loads(json.dumps(CommandSpec().to_json()))) == CommandSpec()  # no gang


@pytest.mark.parametrize(
    "gang",
    [
        {"world_size": 2, "ranks": [0, 2]},  # a rank outside the world
        {"world_size": 2, "ranks": []},
        {"world_size": 2, "ranks": [1]},  # without rank 0 and without its port
        {"world_size": 2, "ranks": [0], "nodes": 2},  # an unknown field
        [0, 1],
    ],
)
def test_a_malformed_gang_is_refused(gang: object) -> None:
    with pytest.raises((ValueError, TypeError)):
        CommandSpec.from_json({"gang": gang})


def test_each_rank_gets_torchruns_variables() -> None:
    gang = GangRanks(4, (2, 3), master_addr="10.0.0.2", master_port=29500)
    env = rank_env({"PATH": "/bin", "RANK": "stale"}, gang, 1, 29500)
    assert env == {
        "PATH": "/bin",
        "WORLD_SIZE": "4",
        "RANK": "3",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "2",
        "MASTER_ADDR": "10.0.0.2",
        "MASTER_PORT": "29500",
    }


def test_a_rank_log_is_made_with_the_main_logs_mode_and_appended_to(tmp_path: Path) -> None:
    main = tmp_path / "w.log"
    main.write_text("")
    main.chmod(0o640)
    path = rank_log_path(main, 1)
    assert path == tmp_path / "w.log.rank1" and rank_log_path(main, 0) == main
    path.write_bytes(b"earlier run\n")
    with open(main, "ab") as like:
        fd = _open_like(path, like.fileno())
        os.write(fd, b"this run\n")
        os.close(fd)
    assert path.read_bytes() == b"earlier run\nthis run\n"
    path.unlink()
    with open(main, "ab") as like:
        os.close(_open_like(path, like.fileno()))
    assert path.stat().st_mode & 0o777 == 0o640 and path.stat().st_uid == main.stat().st_uid


def test_the_local_backend_refuses_a_gang_across_hosts(tmp_path: Path) -> None:
    """It runs on one host: a launch with ranks on another host fails at once, naming ``gang_parts``."""
    from tessera.backends.base import GangPart, GangRanks, LaunchSpec
    from tessera.backends.local import LocalBackend
    from tessera.errors import InvalidRequestError

    backend = LocalBackend(tmp_path / "procs")
    spec = LaunchSpec("1", ("true",), gang=GangRanks(2, (0,)), gang_parts=(GangPart("n2", (1,)),))
    with pytest.raises(InvalidRequestError) as caught:
        backend.launch(spec)
    assert caught.value.field == "gang_parts" and "n2" in caught.value.message
    assert not backend.tracked()
