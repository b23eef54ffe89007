"""Options and the API client shared by the CLI's commands (``commands``, ``models``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from tessera.cli.settings import resolve_settings

if TYPE_CHECKING:  # httpx and the wire types load when a command calls the server, not for --help
    from tessera.client.http import TesseraClient

UrlOption = Annotated[str | None, typer.Option("--url", help="Server address (default: $TESSERA_URL, config file).")]
TokenOption = Annotated[
    str | None, typer.Option("--token", help="Bearer token (default: $TESSERA_TOKEN, config file).", show_default=False)
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]


def client_for(url: str | None, token: str | None) -> TesseraClient:
    from tessera.client.http import TesseraClient

    settings = resolve_settings(url, token)
    return TesseraClient(settings.url, settings.token)
