"""Every command starts fast: building the command line and printing an API command's help loads none of the heavy
packages (scipy through the placement policies, numpy, the server's FastAPI and SQLAlchemy, matplotlib, the
simulator, even httpx). Before, ``tessera jobs --help`` imported tessera.core.placement and so scipy.optimize,
about 0.7 s of its 1.2 s. And a command's help builds that command alone: the other commands' modules are
imported when they are named (tessera.cli.lazy); typer's own pydantic, and the Markdown and Pygments of its rich help,
wait until they are used (tessera.cli.lean_typer). Checked by module, not by time: the suite's machine is shared and
timings vary."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import typer

HEAVY = (
    "scipy",
    "numpy",
    "matplotlib",
    "sqlalchemy",
    "fastapi",
    "httpx",
    "tessera.core.placement",
    "tessera.server",
    "tessera.sim",
    "tessera.client.http",
    "tessera.api",  # the wire types (pydantic models): the SDK reads health and logs with them, nothing else
    # typer's: converting option values (tessera.cli.lean_typer defers it), Markdown help and rich tracebacks
    "pydantic",
    "rich.markdown",
    "rich.traceback",
    "markdown_it",
    "pygments",
)
# The modules of the commands other than jobs, and what only they use (PyYAML: submit -f, queue files).
OTHER_COMMANDS = (
    "tessera.cli.history",
    "tessera.cli.job_control",
    "tessera.cli.logs",
    "tessera.cli.models",
    "tessera.cli.queues",
    "tessera.cli.queuefile",
    "yaml",
)
PROBE = """
import json, sys
sys.argv = ["tessera", *sys.argv[1:]]
from tessera.cli.main import app
try:
    app()
except SystemExit:
    pass
print(json.dumps([m for m in {heavy!r} if m in sys.modules]), file=sys.stderr)
"""


def loaded_by(*args: str, among: tuple[str, ...] = HEAVY) -> list[str]:
    """Which of ``among`` ``tessera ARGS`` imports."""
    env = {**os.environ, "COLUMNS": "100"}
    done = subprocess.run(
        [sys.executable, "-c", PROBE.format(heavy=among), *args], capture_output=True, text=True, env=env, timeout=60
    )
    result: list[str] = json.loads(done.stderr.strip().splitlines()[-1])
    return result


@pytest.mark.parametrize(
    "args", [("jobs", "--help"), ("--help",), ("logs", "--help"), ("history", "--help"), ("submit", "--help")]
)
def test_help_loads_no_heavy_package(args: tuple[str, ...]) -> None:
    assert loaded_by(*args) == []


def test_a_command_loads_no_other_command() -> None:
    """``tessera jobs --help`` imports the module of jobs only; ``tessera --help`` lists them all, so loads them."""
    assert loaded_by("jobs", "--help", among=OTHER_COMMANDS) == []
    assert set(loaded_by("--help", among=OTHER_COMMANDS)) >= {"tessera.cli.history", "tessera.cli.models"}


def test_every_listed_command_builds() -> None:
    """Each ``module:attribute`` of the lazy list names a command that typer builds, under its own name."""
    from typer.main import get_command

    from tessera.cli.main import Commands, app

    group = get_command(app)
    assert isinstance(group, Commands)
    ctx = typer.Context(group)
    assert group.list_commands(ctx) == list(Commands.subcommands)
    for name in Commands.subcommands:
        command = group.get_command(ctx, name)
        assert command is not None and command.name == name and command.help


def test_an_api_command_loads_only_its_client() -> None:
    """``tessera jobs`` against no server: httpx loads; the wire types, the scheduler and the server do not, nor
    httpx's own command line (click, Pygments, rich) nor, as nothing is printed but the error, rich."""
    loaded = loaded_by("jobs", "--url", "http://127.0.0.1:9", among=(*HEAVY, "httpx._main", "click", "rich"))
    assert "tessera.client.http" in loaded and "httpx" in loaded
    assert not {"scipy", "numpy", "sqlalchemy", "fastapi", "tessera.core.placement", "tessera.server"} & set(loaded)
    assert not {"tessera.api", "httpx._main", "click", "pygments", "rich"} & set(loaded)


def test_shell_completion_is_offered() -> None:
    from typer.testing import CliRunner

    from tessera.cli.main import app

    result = CliRunner().invoke(app, ["--help"])
    assert "--install-completion" in result.output and "--show-completion" in result.output


def test_httpx_keeps_its_command_line() -> None:
    """The CLI imports httpx without ``httpx._main``; ``httpx.main`` still runs httpx's command line when called."""
    probe = """
import sys
from tessera.cli.options import import_httpx_without_its_cli
import_httpx_without_its_cli()
assert "httpx" in sys.modules and "httpx._main" not in sys.modules and "click" not in sys.modules
import httpx
try:
    httpx.main(["--help"])
except SystemExit as exc:
    assert exc.code == 0
"""
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "Usage: " in done.stdout and "httpx" in done.stdout
