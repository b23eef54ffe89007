"""The job options' parsers (shared by the server and the CLI) and ``tessera submit``'s flags turned into the body,
each mistake refused naming the flag."""

from __future__ import annotations

import pytest

from tessera.api.job_options import format_duration, parse_array, parse_dependency, parse_duration
from tessera.cli.submit_flags import job_options, with_defaults
from tessera.core.errors import InvalidRequestError


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("2h", 7200), ("90m", 5400), ("45s", 45), ("1.5h", 5400), ("1d", 86400), ("1:30:00", 5400), ("30:00", 1800),
     ("1-00:00:00", 86400), ("2-12", 2 * 86400 + 12 * 3600), ("1-02:30", 86400 + 9000), ("600", 600), (600, 600)],
)  # fmt: skip
def test_durations_in_slurm_and_plain_forms(text: str | int, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "2 hours", "0", "-5", "1:60:00", "h", "400d", True])
def test_bad_durations(text: str | bool) -> None:
    with pytest.raises(ValueError):
        parse_duration(text)


def test_durations_are_shown_back_short() -> None:
    assert [format_duration(s) for s in (7200, 5400, 90, 86400 + 1, 2.5)] == ["2h", "1h30m", "1m30s", "1d1s", "2.5s"]


def test_arrays_ranges_steps_lists_and_a_limit() -> None:
    assert parse_array("0-9").indices == tuple(range(10))
    assert parse_array("0-9:2").indices == (0, 2, 4, 6, 8)
    assert parse_array("1,3,5").indices == (1, 3, 5)
    assert parse_array("0-2,8,2%3") == type(parse_array("0"))((0, 1, 2, 8), 3)
    for bad in ("", "a-b", "5-1", "0-9:0", "0-9%0", "0-9%x", "0-1000000000", "0-1000"):
        with pytest.raises(ValueError):
            parse_array(bad)


def test_dependencies() -> None:
    assert parse_dependency("afterok:12:13").ids == (12, 13)
    assert parse_dependency("afternotok:7").text() == "afternotok:7"
    assert parse_dependency("afterany:3:3").ids == (3,)
    for bad in ("afterok", "afterok:", "afterok:x", "after:1", "afterok:0", "afterok:-1"):
        with pytest.raises(ValueError):
            parse_dependency(bad)


def test_flags_become_the_body_with_the_submit_directory() -> None:
    body = job_options(
        chdir="data/../run",
        env=["A=1", "B=x=y", "EMPTY="],
        export="HOME_DIR,A",
        time_limit="1:30:00",
        array="0-3%2",
        dependency="afterok:4",
        hold=True,
        environ={"HOME_DIR": "/home/me", "A": "from-env"},
        here=lambda: "/home/me/project",
    )
    assert body == {
        "cwd": "/home/me/project/run",
        "env": {"HOME_DIR": "/home/me", "A": "1", "B": "x=y", "EMPTY": ""},  # --env wins over --export
        "time_limit": "1:30:00",
        "array": "0-3%2",
        "dependency": "afterok:4",
        "hold": True,
    }
    nothing = job_options(
        chdir=None, env=None, export=None, time_limit=None, array=None, dependency=None, hold=False, environ={}
    )
    assert nothing == {}


@pytest.mark.parametrize(
    ("flags", "field"),
    [
        ({"chdir": " "}, "--chdir"),
        ({"env": ["1A=x"]}, "--env"),
        ({"env": ["A"]}, "--env"),
        ({"export": "MISSING"}, "--export"),
        ({"export": "not-a-name"}, "--export"),
        ({"time_limit": "soon"}, "--time"),
        ({"array": "1-"}, "--array"),
        ({"dependency": "afterok"}, "--dependency"),
    ],
)
def test_bad_flags_name_the_flag(flags: dict[str, object], field: str) -> None:
    given: dict[str, object] = {
        "chdir": None, "env": None, "export": None, "time_limit": None, "array": None, "dependency": None,
        "hold": False, **flags,
    }  # fmt: skip
    with pytest.raises(InvalidRequestError) as caught:
        job_options(**given, environ={})  # type: ignore[arg-type]
    assert caught.value.field == field


def test_a_submission_runs_here_with_the_submitters_path_unless_it_says_otherwise() -> None:
    environ = {"PATH": "/home/me/.venv/bin:/usr/bin", "OTHER": "x"}
    here = lambda: "/home/me/project"  # noqa: E731
    assert with_defaults({}, environ, here) == {"cwd": "/home/me/project", "env": {"PATH": environ["PATH"]}}
    given = {"cwd": "/elsewhere", "env": {"PATH": "/opt/bin", "A": "1"}}
    assert with_defaults(dict(given), environ, here) == given
    assert with_defaults({"env": {}}, {}, here) == {"cwd": "/home/me/project", "env": {}}
