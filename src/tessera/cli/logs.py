"""``tessera logs ID [--tail N] [-f] [--rank R]``: a workload's output (of one rank of a multi-worker job: each rank
logs apart, rank 0 in the workload's log), written to stdout as the bytes the workload wrote
(the server sends whole UTF-8 characters; they are written back as UTF-8 whatever the terminal's locale). With
``-f`` it follows until the workload ends, then exits with the workload's exit code (a signal N as 128 + N, as
shells report it; 1 for a workload that ended without one, e.g. cancelled before it started)."""

from __future__ import annotations

import sys
from typing import Annotated, Any

import typer

from tessera.cli.options import TokenOption, UrlOption, client_for
from tessera.cli.terminal import one_line_errors

NO_EXIT_CODE = 1


def logs(
    workload_id: Annotated[int, typer.Argument(help="Workload id.")],
    follow: Annotated[
        bool, typer.Option("-f", "--follow", help="Keep printing until it ends, then exit with its exit code.")
    ] = False,
    tail: Annotated[
        int | None, typer.Option("--tail", "-n", min=0, help="Only the last N lines (then follow with -f).")
    ] = None,
    rank: Annotated[
        int, typer.Option("--rank", "-r", min=0, help="A multi-worker job's rank: its own output (0: the first).")
    ] = 0,
    url: UrlOption = None,
    token: TokenOption = None,
) -> None:
    """A workload's output (stdout and stderr together)."""
    code = 0
    with one_line_errors(), client_for(url, token) as client:
        if follow:
            chunks = client.follow_logs(workload_id, tail=tail, rank=rank)
        else:
            chunks = client.read_logs(workload_id, tail=tail, rank=rank)
        out = sys.stdout.buffer
        for text in chunks:
            out.write(text.encode("utf-8", errors="surrogateescape"))
            out.flush()
        if follow:
            code = exit_status(client.workload(workload_id))
    if code:
        raise typer.Exit(code)


def exit_status(workload: dict[str, Any]) -> int:
    """What ``logs -f`` exits with once ``workload`` ended: its exit code as a shell reports it."""
    code = workload.get("exit_code")
    if code is None:
        return 0 if workload.get("state") == "succeeded" else NO_EXIT_CODE
    code = int(code)
    if code < 0:  # killed by signal -code
        return 128 + (-code)
    return code & 0xFF
