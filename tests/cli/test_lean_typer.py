"""``tessera.cli.lean_typer`` changes when typer imports pydantic, rich's Markdown and rich's tracebacks, nothing else:
a typer app that uses all three (Markdown help, typed options, a pretty traceback) prints the same bytes and exits with
the same codes with it as without it. Each run is a fresh interpreter, since both patches act once per process."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

DEMO = '''
import sys
if sys.argv[1] == "lean":
    from tessera.cli import lean_typer
    assert lean_typer.defer_adapters() and lean_typer.light_rich_help(), "typer is not laid out as lean_typer expects"
from pathlib import Path
import typer
app = typer.Typer(rich_markup_mode="markdown", pretty_exceptions_enable=True, pretty_exceptions_show_locals=False)

@app.command()
def run(
    count: int = typer.Option(1, min=0, help="**How many** times: a `number`."),
    name: str = "x",
    where: Path | None = None,
    tags: list[str] | None = None,
    fail: bool = False,
) -> None:
    """Say a name **in Markdown**: `code`, *emphasis*, and a list:

    * one
    * two
    """
    if fail:
        raise RuntimeError("boom")
    print(name * count, where, tags)

@app.command()
def other() -> None:
    """Nothing."""

sys.argv = ["demo", *sys.argv[2:]]
app()
'''

CASES = [
    ["--help"],
    ["run", "--help"],
    ["run", "--count", "2", "--name", "ab", "--where", "/tmp", "--tags", "a", "--tags", "b"],
    ["run"],
    ["run", "--count", "x"],
    ["run", "--count", "-1"],
    ["run", "--fail"],
    ["nosuch"],
]


def demo(mode: str, args: list[str]) -> tuple[int, str, str]:
    env = {**os.environ, "COLUMNS": "100", "TERM": "dumb"}
    done = subprocess.run(
        [sys.executable, "-c", DEMO, mode, *args], capture_output=True, text=True, env=env, timeout=60
    )
    return done.returncode, done.stdout, done.stderr


@pytest.mark.parametrize("args", CASES, ids=" ".join)
def test_same_output_and_exit_code_with_and_without(args: list[str]) -> None:
    lean = demo("lean", args)
    assert "lean_typer expects" not in lean[2]
    assert lean == demo("plain", args)


def test_the_real_classes_are_there_after() -> None:
    """Once typer.rich_utils has loaded with the stand-ins, rich.markdown is rich's own module, and the stand-in
    hands over to rich's class."""
    probe = """
import sys
from tessera.cli import lean_typer
lean_typer.install()
import typer.rich_utils
assert "rich.markdown" not in sys.modules and "pygments" not in sys.modules and "pydantic" not in sys.modules
import rich.markdown
assert hasattr(rich.markdown, "MarkdownIt")
assert isinstance(typer.rich_utils.Markdown("*x*"), rich.markdown.Markdown)
import rich.traceback
assert typer.rich_utils.Traceback.from_exception.__func__ is rich.traceback.Traceback.from_exception.__func__
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "ok", done.stderr
