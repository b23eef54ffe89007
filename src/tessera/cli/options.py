"""Options and the API client shared by the CLI's commands (``commands``, ``models``).

``--url`` and ``--token`` are taken before the subcommand too (``tessera --token X jobs``, as after it): the root
callback (``tessera.cli.main``) records them in ``BEFORE_COMMAND`` for the one command the process runs, and
``client_for`` uses them where the command's own are not given."""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from tessera.cli.settings import resolve_settings

if TYPE_CHECKING:  # httpx and the wire types load when a command calls the server, not for --help
    from tessera.client.http import TesseraClient

UrlOption = Annotated[str | None, typer.Option("--url", help="Server address (default: $TESSERA_URL, config file).")]
TokenOption = Annotated[
    str | None, typer.Option("--token", help="Bearer token (default: $TESSERA_TOKEN, config file).", show_default=False)
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]
NodesOption = Annotated[
    Path | None,
    typer.Option("--nodes", help="Node list CSV (openb format); with --pods. Default: the embedded synthetic cluster."),
]
PodsOption = Annotated[
    Path | None,
    typer.Option("--pods", help="Pod list CSV (openb format, 11 or 5 columns); with --nodes."),
]


@dataclass(slots=True)
class ServerOptions:
    """``--url`` and ``--token`` as given before the subcommand (None: not given)."""

    url: str | None = None
    token: str | None = None


BEFORE_COMMAND = ServerOptions()  # set by the root callback on every run (tessera.cli.main._root)


def client_for(url: str | None, token: str | None) -> TesseraClient:
    import_httpx_without_its_cli()
    from tessera.client.http import TesseraClient

    settings = resolve_settings(url or BEFORE_COMMAND.url, token or BEFORE_COMMAND.token)
    return TesseraClient(settings.url, settings.token)


def finite_float(text: str) -> float:
    """A float option's value (typer's ``parser=``): a finite number; ``nan``, ``inf`` and words are refused, as
    one line naming the option (``Invalid value for '--gpu-fraction': ...``, exit 2)."""
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise ValueError(f"{text!r} is not a finite number")
    return value


def import_httpx_without_its_cli() -> None:
    """Import httpx without ``httpx._main``, its own command line, which ``import httpx`` loads whenever click and
    rich are installed (they are: typer and the CLI's tables) and which imports click, Pygments, ``rich.progress`` and
    ``rich.syntax``: about half of httpx's import time, for a tool the ``tessera`` command never runs. ``httpx.main``
    then imports it on first call, as it would have."""
    if "httpx" in sys.modules or "httpx._main" in sys.modules:
        return
    sys.modules["httpx._main"] = None  # type: ignore[assignment]  # makes httpx's `from ._main import main` fail
    try:
        import httpx
    finally:
        if sys.modules.get("httpx._main", "") is None:
            del sys.modules["httpx._main"]

    def main(*args: Any, **kwargs: Any) -> Any:
        from httpx._main import main as httpx_main

        return httpx_main(*args, **kwargs)

    httpx.main = main  # type: ignore[assignment]  # a function in place of the click command it calls
