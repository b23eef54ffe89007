"""``tessera history``: accounting like Slurm's ``sacct`` (``GET /v1/history``): each workload's start, end,
elapsed time, wait, GPUs, GPU-hours and where it ran, kept after it ended; ``--totals`` sums them per tenant
(``GET /v1/history/totals``). A tenant's token sees only its own.

Times for ``--since`` and ``--until``: an ISO date or date and time in local time (``2026-11-25``,
``2026-11-25T14:00``), a time ago (``90m``, ``2h``, ``7d``), ``now``, or seconds since the epoch."""

from __future__ import annotations

import json
import math
import re
import time
from datetime import datetime
from typing import Annotated, Any

import typer

from tessera.cli.options import JsonOption, TokenOption, UrlOption, client_for
from tessera.cli.terminal import one_line_errors
from tessera.errors import InvalidRequestError

STATES = ("pending", "running", "succeeded", "failed", "cancelled", "preempted")
_AGO = re.compile(r"^(\d+(?:\.\d+)?)\s*([smhdw])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_when(text: str, option: str, now: float) -> float:
    """Seconds since the epoch for ``--since``/``--until`` (see the module's doc); ``InvalidRequestError`` naming
    ``option`` otherwise."""
    value = text.strip().lower()
    if value == "now":
        return now
    if match := _AGO.match(value):
        return now - float(match.group(1)) * _UNIT_S[match.group(2)]
    try:
        seconds = float(value)
    except ValueError:
        pass
    else:
        if not math.isfinite(seconds):
            raise InvalidRequestError(option, f"not a time: {text!r} (a finite number of seconds since the epoch)")
        return seconds
    try:
        return datetime.fromisoformat(text.strip()).timestamp()
    except ValueError:
        raise InvalidRequestError(
            option, f"not a time: {text!r} (give 2026-11-25, 2026-11-25T14:00, 2h, 7d, now or epoch seconds)"
        ) from None


def history(
    since: Annotated[
        str | None, typer.Option("--since", "-S", help="Only workloads not ended before: 2h, 7d, 2026-11-25.")
    ] = None,
    until: Annotated[str | None, typer.Option("--until", "-E", help="Only workloads submitted by then.")] = None,
    state: Annotated[
        list[str] | None, typer.Option("--state", "-s", help="Only these states (repeat, or a,b).")
    ] = None,
    queue: Annotated[str | None, typer.Option("--queue", "-q", help="Only this queue.")] = None,
    tenant: Annotated[str | None, typer.Option("--tenant", help="Only this tenant (admin).")] = None,
    totals: Annotated[
        bool, typer.Option("--totals", help="Per-tenant totals instead of one line per workload.")
    ] = False,
    as_json: JsonOption = False,
    url: UrlOption = None,
    token: TokenOption = None,
) -> None:
    """Accounting (like sacct): start, end, elapsed, wait, GPU-hours, where each ran; --totals per tenant."""
    with one_line_errors():
        now = time.time()
        start = parse_when(since, "--since", now) if since is not None else None
        end = parse_when(until, "--until", now) if until is not None else None
        states = [s.strip().lower() for group in state or [] for s in group.split(",") if s.strip()]
        for s in states:
            if s not in STATES:
                raise InvalidRequestError("--state", f"unknown state {s!r} (one of {', '.join(STATES)})")
        with client_for(url, token) as client:
            if totals:
                if states:
                    raise InvalidRequestError("--state", "not with --totals (totals count every state)")
                rows = client.usage(since=start, until=end, queue=queue, tenant=tenant)
            else:
                rows = client.history(since=start, until=end, states=states or None, queue=queue, tenant=tenant)
    if as_json:
        typer.echo(json.dumps(rows))
    elif totals:
        _print_totals(rows)
    else:
        _print_history(rows)


def _print_history(rows: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = Console()
    tenants = len({r["tenant"] for r in rows}) > 1  # a tenant's own history needs no tenant column
    wide = console.width >= 110  # a narrow terminal leaves out the exit code and the wait (--json has them)
    cells: dict[str, Any] = {
        "ID": lambda r: str(r["id"]),
        "NAME": lambda r: escape(name_of(r)),
        "TENANT": lambda r: escape(r["tenant"]),
        "QUEUE": lambda r: escape(r["queue"]),
        "STATE": lambda r: r["state"],
        "EXIT": lambda r: "-" if r["exit_code"] is None else str(r["exit_code"]),
        "START": lambda r: _stamp(r["started_at"]),
        "ELAPSED": lambda r: duration(r["elapsed_s"]) if r["started_at"] is not None else "-",
        "WAIT": lambda r: duration(r["wait_s"]) if r["wait_s"] is not None else "-",
        "GPU-H": lambda r: f"{r['gpu_hours']:.3f}",
        "WHERE": lambda r: escape("; ".join(r["where"]) or "-"),
    }
    shown = [c for c in cells if (c != "TENANT" or tenants) and (wide or c not in ("EXIT", "WAIT"))]
    table = Table(box=None, header_style="bold")
    for column in shown:  # the end, GPUs and UUIDs: --json
        if column == "WHERE":  # the one column that may take several lines
            table.add_column(column, overflow="fold", min_width=10)
        elif column in ("NAME", "TENANT", "QUEUE"):  # cut short with an ellipsis in a narrow terminal
            table.add_column(column, overflow="ellipsis", min_width=4, max_width=20)
        else:
            table.add_column(column, no_wrap=True, min_width=len(column))
    for r in rows:
        table.add_row(*(cells[c](r) for c in shown))
    console.print(table)


def name_of(record: dict[str, Any]) -> str:
    """A record's name as ``tessera jobs`` shows it: its name, else its command (cut at 30 characters), and
    ``[index]`` for an array's task."""
    name = record["name"] or " ".join(record.get("command") or [])[:30] or "-"
    index = record.get("array_index")
    return f"{name}[{index}]" if index is not None else name


def _print_totals(rows: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    table = Table(box=None, header_style="bold")
    for column in ("TENANT", "WORKLOADS", "SUCCEEDED", "FAILED", "GPU-HOURS", "CPU-HOURS", "MEAN WAIT"):
        table.add_column(column, justify="left" if column == "TENANT" else "right")
    for r in rows:
        wait = r["wait_s_mean"]
        table.add_row(
            escape(r["tenant"]),
            str(r["workloads"]),
            str(r["succeeded"]),
            str(r["failed"]),
            f"{r['gpu_hours']:.3f}",
            f"{r['cpu_hours']:.3f}",
            duration(wait) if wait is not None else "-",
        )
    Console().print(table)


def duration(seconds: float) -> str:
    """``H:MM:SS`` (days as ``D-HH:MM:SS``, as sacct writes them)."""
    whole = max(0, int(round(seconds)))
    days, rest = divmod(whole, 86400)
    hours, rest = divmod(rest, 3600)
    text = f"{hours}:{rest // 60:02d}:{rest % 60:02d}"
    return f"{days}-{hours:02d}:{rest // 60:02d}:{rest % 60:02d}" if days else text


def _stamp(at: float | None) -> str:
    return "-" if at is None else time.strftime("%m-%d %H:%M", time.localtime(at))
