"""What every command line of Tessera shares: expected failures become one line ``error: <message>`` on stderr and
exit code 2, never a traceback."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

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


def fail(message: str) -> None:
    typer.echo("error: " + " ".join(message.splitlines()), err=True)
    raise typer.Exit(EXIT_BAD_INPUT)
