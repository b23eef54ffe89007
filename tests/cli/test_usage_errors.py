"""Errors that typer itself finds (a value it cannot convert, an unknown option or command, a missing argument) end
like every other CLI error: one ``error:`` line naming the option and the command's help, exit 2, no traceback and
no boxed usage screen. ``tessera`` alone still prints the help (exit 2, as typer does)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


def tessera(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TESSERA_URL": "http://127.0.0.1:9", "COLUMNS": "80"}
    return subprocess.run(
        [sys.executable, "-m", "tessera.cli", *args], capture_output=True, text=True, env=env, timeout=60
    )


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (("submit", "--gpus", "two", "--", "true"), ("'--gpus'", "valid integer", "tessera submit --help")),
        (("models", "deploy", "m", "--engine", "sim", "--gpu-fraction", "abc"), ("'--gpu-fraction'", "number")),
        (("jobs", "--bogus"), ("No such option: --bogus", "tessera jobs --help")),
        (("models", "deploy"), ("Missing argument 'name'",)),
        (("nosuch",), ("No such command 'nosuch'", "tessera --help")),
        (("logs", "1", "--rank", "-1"), ("'--rank'", "greater than or equal to 0", "tessera logs --help")),
        (("submit", "--elastic", "4-2", "--", "true"), ("--elastic", "minimum 4 is above the maximum 2")),
        (("submit", "--elastic", "two", "--", "true"), ("--elastic", "not MIN-MAX")),
        (("submit", "--elastic", "0-2", "--", "true"), ("--elastic", "at least 1")),
    ],
)
def test_a_usage_error_is_one_line_with_exit_2(args: tuple[str, ...], fragments: tuple[str, ...]) -> None:
    done = tessera(*args)
    assert done.returncode == 2, (done.returncode, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    assert "Traceback" not in done.stderr and "╭" not in done.stderr and done.stdout == ""


def test_tessera_alone_prints_the_help() -> None:
    done = tessera()
    assert done.returncode == 2
    assert "Usage: tessera" in done.stdout + done.stderr and "submit" in done.stdout + done.stderr
    assert "error:" not in done.stderr


def test_a_command_exit_code_passes_through() -> None:
    done = tessera("jobs")  # no server there: the command's own one-line error and exit code
    assert done.returncode == 2 and done.stderr.startswith("error: cannot reach the Tessera server")
    assert tessera("jobs", "--help").returncode == 0
