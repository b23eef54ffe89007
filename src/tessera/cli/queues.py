"""``tessera queues`` (list), ``tessera queues apply -f queues.yaml`` (create or replace the file's queues; the
format is in ``queuefile``) and ``tessera queues delete NAME`` (refused while workloads wait or run in it)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from tessera.cli.options import JsonOption, TokenOption, UrlOption, client_for
from tessera.cli.terminal import one_line_errors

queues_app = typer.Typer(
    help="Queues and quotas: list them, apply a YAML file of them, delete one.", invoke_without_command=True
)
CONFIG_FIELDS = ("tenant", "cohort", "nominal", "borrowing_limit", "lending_limit", "weight", "strategy")


@queues_app.callback()
def queues(ctx: typer.Context, url: UrlOption = None, token: TokenOption = None, as_json: JsonOption = False) -> None:
    """Queues, their quotas and what they use now (apply and delete: admin)."""
    if ctx.invoked_subcommand is not None:
        return
    with one_line_errors(), client_for(url, token) as client:
        found = client.queues()
    if as_json:
        typer.echo(json.dumps(found))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(box=None, header_style="bold")
    for column in ("QUEUE", "TENANT", "COHORT", "NOMINAL GPUS", "BORROW", "LEND", "USED GPUS", "RUNNING", "PENDING"):
        table.add_column(column)
    for q in found:
        used = sum(u["gpu_milli"] for u in q["usage"].values()) / 1000
        table.add_row(
            q["name"],
            q["tenant"],
            q["cohort"] or "-",
            _gpus(q["nominal"]) or "unlimited",
            _gpus(q["borrowing_limit"]) or "-",
            _gpus(q["lending_limit"]) or "-",
            f"{used:g}",
            str(q["running"]),
            str(q["pending"]),
        )
    Console().print(table)


@queues_app.command("apply")
def apply(
    file: Annotated[Path, typer.Option("-f", "--file", help="YAML file of queues (see docs/cli.md).")],
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Check the file and say what would change.")] = False,
    url: UrlOption = None,
    token: TokenOption = None,
) -> None:
    """Create or replace the queues of a YAML file (Kueue's words: cohort, nominalQuota, borrowingLimit,
    lendingLimit); applying it again changes nothing. Errors name FILE:LINE: field (exit 2)."""
    from pydantic import ValidationError

    from tessera.api import QueueIn
    from tessera.cli.queuefile import load_queue_file
    from tessera.client.errors import ApiError

    with one_line_errors():
        docs = load_queue_file(file)
        for doc in docs:  # the whole file is checked before anything is sent
            try:
                QueueIn.model_validate(doc.body)
            except ValidationError as exc:
                first = exc.errors()[0]
                raise doc.locate(str(file), tuple(first["loc"]), first["msg"]) from None
        with client_for(url, token) as client:
            before = {q["name"]: q for q in client.queues()}
            for doc in docs:
                name = doc.body["name"]
                if dry_run:
                    typer.echo(f"queue {name}: {'would be replaced' if name in before else 'would be created'}")
                    continue
                try:
                    after = client.put_queue(doc.body)
                except ApiError as exc:
                    if exc.status in (0, 401, 403):
                        raise
                    parts = tuple(exc.field.split(".")) if exc.field else ()
                    message = exc.detail.removeprefix(f"{exc.field}: ") if exc.field else exc.detail
                    raise doc.locate(str(file), parts, message) from None
                typer.echo(f"queue {name}: {_change(before.get(name), after)}")


@queues_app.command("delete")
def delete(
    name: Annotated[str, typer.Argument(help="Queue name.")],
    url: UrlOption = None,
    token: TokenOption = None,
) -> None:
    """Delete a queue. Refused while workloads of it wait or run (cancel them first) or a model deploys into it;
    ended workloads keep its name in their history. A tenant left without a queue cannot submit until it gets one."""
    with one_line_errors(), client_for(url, token) as client:
        client.delete_queue(name)
        typer.echo(f"queue {name} deleted")


def _change(before: dict[str, Any] | None, after: dict[str, Any]) -> str:
    if before is None:
        return "created"
    same = all(before.get(k) == after.get(k) for k in CONFIG_FIELDS)
    return "unchanged" if same else "configured"


def _gpus(limits: dict[str, dict[str, int]] | None) -> str:
    if not limits:
        return ""
    return ", ".join(f"{f}={v['gpu_milli'] / 1000:g}" for f, v in limits.items() if "gpu_milli" in v)
