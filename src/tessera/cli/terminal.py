"""What every command line of Tessera shares: expected failures become one line ``error: <message>`` on stderr and
exit code 2, never a traceback."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, NoReturn

import typer

from tessera.errors import TesseraError

EXIT_BAD_INPUT = 2


@contextmanager
def one_line_errors() -> Iterator[None]:
    """Turn expected failures into ``error: <message>`` on stderr and exit code 2."""
    try:
        yield
    except TesseraError as exc:
        fail(str(exc))
    except OSError as exc:  # a missing, unreadable or unwritable path (input files report theirs as TesseraError)
        where = f"{exc.filename}: " if exc.filename else ""
        fail(f"{where}{exc.strerror or exc}")
    except UnicodeDecodeError as exc:  # a text file read without tessera.textfiles: still one line
        fail(f"a file is not UTF-8 text (byte 0x{exc.object[exc.start : exc.start + 1].hex()} at offset {exc.start})")


def fail(message: str) -> None:
    typer.echo("error: " + " ".join(message.splitlines()), err=True)
    raise typer.Exit(EXIT_BAD_INPUT)


def run_app(app: typer.Typer) -> None:
    """Run the typer app as ``tessera``. A value or option typer itself cannot take (``--gpus two``, an unknown
    option, a missing argument) ends as every other error does: one line naming the option, exit 2."""
    # typer's own click (vendored in recent releases, click itself before): its error class is BadParameter's base.
    click_exception = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")
    try:
        code = app(prog_name="tessera", standalone_mode=False)  # "tessera" under `python -m tessera.cli` too
    except typer.Abort:
        typer.echo("Aborted.", err=True)
        sys.exit(130)
    except Exception as exc:
        if not isinstance(exc, click_exception):
            raise
        _exit_on_usage_error(exc)
    sys.exit(code if isinstance(code, int) else 0)


def _exit_on_usage_error(exc: Any) -> NoReturn:
    message = " ".join(exc.format_message().split())
    if message:  # empty for `tessera` alone, whose help typer has printed already (exit 2, as before)
        ctx = getattr(exc, "ctx", None)
        hint = f" (see {ctx.command_path} --help)" if ctx is not None else ""
        typer.echo(f"error: {message}{hint}", err=True)
    sys.exit(exc.exit_code)
