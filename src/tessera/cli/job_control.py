"""``tessera cancel``, ``hold`` and ``release`` of several workloads: by id, or (cancel) by filter (``--state``,
``--queue``, ``--name``, ``--array``). Each prints a line per workload it touched; a workload that could not be
touched is an ``error:`` line on stderr, the others are still done, and the exit code is then 2.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any

import typer

from tessera.cli.options import TokenOption, UrlOption, client_for
from tessera.cli.terminal import EXIT_BAD_INPUT, fail, one_line_errors
from tessera.client.errors import ApiError

if TYPE_CHECKING:  # httpx loads only when a command calls the server (tests/cli/test_startup.py)
    from tessera.client.http import TesseraClient

ACTIVE = ("pending", "running")
Ids = Annotated[list[int] | None, typer.Argument(help="Workload ids.", show_default=False)]


def cancel(
    workload_ids: Ids = None,
    state: Annotated[
        list[str] | None, typer.Option("--state", help="Only workloads in this state: pending or running (repeat).")
    ] = None,
    queue: Annotated[str | None, typer.Option("--queue", help="Only workloads of this queue.")] = None,
    name: Annotated[str | None, typer.Option("--name", help="Only workloads of this name.")] = None,
    array: Annotated[int | None, typer.Option("--array", help="Only the tasks of this array.")] = None,
    url: UrlOption = None,
    token: TokenOption = None,
) -> None:
    """Cancel workloads by id (tessera cancel 12 13) or by filter (tessera cancel --state pending --queue q); a
    running one gets SIGTERM, then SIGKILL after a grace period. With ids and filters, the ids that match."""
    with one_line_errors():
        states = list(state or ACTIVE)
        for given in states:
            if given not in ACTIVE:
                raise ApiError(0, f"--state: {given!r} cannot be cancelled; give pending or running")
        filtered = bool(state or queue or name or array)
        if not workload_ids and not filtered:
            raise ApiError(0, "nothing to cancel: give workload ids or a filter (--state, --queue, --name, --array)")
        with client_for(url, token) as client:
            ids = list(dict.fromkeys(workload_ids or []))
            if filtered:
                found = [w["id"] for w in client.workloads(states, queue, name=name, array=array)]
                ids = [i for i in found if i in ids] if ids else found
                if not ids:
                    typer.echo("no workload matches: nothing cancelled")
                    return
            _each(client, ids, client.cancel, _cancelled)


def hold(workload_ids: Ids = None, url: UrlOption = None, token: TokenOption = None) -> None:
    """Keep pending workloads from being scheduled (why pending: held) until tessera release."""
    with one_line_errors(), client_for(url, token) as client:
        _each(client, _required(workload_ids), client.hold, lambda w: "held")


def release(workload_ids: Ids = None, url: UrlOption = None, token: TokenOption = None) -> None:
    """Let held workloads be scheduled again."""
    with one_line_errors(), client_for(url, token) as client:
        _each(client, _required(workload_ids), client.release, lambda w: f"released ({w['state']})")


def _required(ids: list[int] | None) -> list[int]:
    if not ids:
        raise ApiError(0, "give one or more workload ids")
    return list(dict.fromkeys(ids))


def _cancelled(w: dict[str, Any]) -> str:
    if w["state"] in ACTIVE:
        return f"stopping ({w['state']})"
    return "cancelled" if w["state"] == "cancelled" else f"already ended ({w['state']})"


def _each(
    client: TesseraClient,
    ids: list[int],
    act: Callable[[int], dict[str, Any]],
    said: Callable[[dict[str, Any]], str],
) -> None:
    """``act`` on each id, a line for each; the ids that failed are reported and make the exit code 2."""
    failed = 0
    for workload_id in ids:
        try:
            w = act(workload_id)
        except ApiError as exc:
            if exc.status == 0:  # no answer from the server: the next ones would fail alike
                fail(str(exc))
            typer.echo(f"error: workload {workload_id}: {exc}", err=True)
            failed += 1
            continue
        typer.echo(f"workload {w['id']}: {said(w)}")
    if failed:
        raise typer.Exit(EXIT_BAD_INPUT)
