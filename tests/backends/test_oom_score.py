"""Who the OOM killer takes in a workload (``backends/oom_score.py``), on stand-in files: the supervisor spares
itself where it may (-1000 once the command is started, which keeps its own score), else the command starts as the
first choice (1000) and the supervisor returns to its score; the kills counted from either cgroup version's file.
(With real processes and a real memory limit: tests/backends/test_workload_limits.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from tessera.backends.oom_score import may_lower_score, oom_kills, spared

STATUS = "Name:\tpython\nCapInh:\t0000000000000000\nCapEff:\t{}\n"


@pytest.mark.parametrize(("cap_eff", "may"), [("000001ffffffffff", True), ("000001fffeffffff", False)])
def test_lowering_a_score_takes_cap_sys_resource(tmp_path: Path, cap_eff: str, may: bool) -> None:
    status = tmp_path / "status"
    status.write_text(STATUS.format(cap_eff))
    assert may_lower_score(status) is may
    assert may_lower_score(tmp_path / "missing") is False


def test_a_privileged_supervisor_spares_itself_once_the_command_is_started(tmp_path: Path) -> None:
    score = tmp_path / "oom_score_adj"
    score.write_text("0\n")
    with spared(score, privileged=True):
        assert score.read_text() == "0\n"  # what the command inherits
    assert score.read_text() == "-1000\n"


def test_otherwise_the_command_starts_as_the_first_choice_and_the_supervisor_returns_to_its_score(
    tmp_path: Path,
) -> None:
    score = tmp_path / "oom_score_adj"
    score.write_text("200\n")
    with spared(score, privileged=False):
        assert score.read_text() == "1000\n"  # what the command inherits
    assert score.read_text() == "200\n"


def test_a_score_that_cannot_be_written_only_warns(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with spared(tmp_path / "no" / "oom_score_adj", privileged=True):
        pass
    assert "cannot keep the OOM killer off the supervisor" in caplog.text


def test_kills_are_counted_in_either_cgroup_version(tmp_path: Path) -> None:
    v2, v1, other = tmp_path / "v2", tmp_path / "v1", tmp_path / "pids"
    for directory in (v2, v1, other):
        directory.mkdir()
    (v2 / "memory.events").write_text("low 0\nhigh 0\nmax 7\noom 2\noom_kill 2\noom_group_kill 0\n")
    (v1 / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 1\n")
    assert oom_kills([v2, v1, other, tmp_path / "gone"]) == 3
