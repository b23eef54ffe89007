"""The CLI over the API: ``tessera submit``, ``jobs``, ``show``, ``nodes`` and ``token create|list|revoke`` here;
``logs`` (``cli/logs.py``), ``cancel``, ``hold`` and ``release`` (``cli/job_control.py``), ``history``
(``cli/history.py``), ``queues`` (``cli/queues.py``) and ``models`` (``cli/models.py``) beside them. Listed on the main
typer app by ``tessera.cli.main``, which imports each module when its command is named; every failure is one ``error:``
line, exit 2. rich loads when a table is printed.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from tessera.cli.options import JsonOption, TokenOption, UrlOption, client_for, finite_float
from tessera.cli.specfile import SpecFile, load_spec_file
from tessera.cli.submit_flags import elastic_range, job_options, with_defaults
from tessera.cli.terminal import one_line_errors
from tessera.client.errors import ApiError
from tessera.errors import InvalidRequestError

token_app = typer.Typer(help="Manage API tokens (admin).", no_args_is_help=True)


def submit(
    command: Annotated[list[str] | None, typer.Argument(help="The command to run, after --.")] = None,
    gpus: Annotated[int | None, typer.Option("--gpus", help="GPUs (0: CPU only).")] = None,
    gpu_mem: Annotated[str | None, typer.Option("--gpu-mem", help="Device memory per GPU, e.g. 10GiB.")] = None,
    gpu_milli: Annotated[int | None, typer.Option("--gpu-milli", help="Share of the GPU in thousandths.")] = None,
    gpu_fraction: Annotated[
        float | None, typer.Option("--gpu-fraction", parser=finite_float, help="Share of the GPU, e.g. 0.3.")
    ] = None,
    gpu_compute: Annotated[int | None, typer.Option("--gpu-compute", help="Compute share in percent.")] = None,
    gpu_type: Annotated[
        str | None, typer.Option("--gpu-type", help="Allowed GPU types, e.g. A100,H100 (without --gpus: one GPU).")
    ] = None,
    cpu: Annotated[str | None, typer.Option("--cpu", help="CPU cores, e.g. 4 or 500m.")] = None,
    mem: Annotated[str | None, typer.Option("--mem", help="Host memory, e.g. 16GiB.")] = None,
    priority: Annotated[
        str | None,
        typer.Option(
            "--priority",
            help="A number (larger first) or a class: inference-critical (1000), training (500), best-effort (100). "
            "Default: training.",
            show_default=False,
        ),
    ] = None,
    queue: Annotated[str | None, typer.Option("--queue", help="Queue (default: your tenant's).")] = None,
    name: Annotated[str | None, typer.Option("--name", help="A name to recognise it by.")] = None,
    kind: Annotated[str | None, typer.Option("--kind", help="batch (default) or service.")] = None,
    spec_file: Annotated[Path | None, typer.Option("-f", "--file", help="A YAML spec (flags override it).")] = None,
    chdir: Annotated[
        str | None, typer.Option("--chdir", "-D", help="Working directory (default: the one you submit from).")
    ] = None,
    env: Annotated[list[str] | None, typer.Option("--env", help="NAME=value in its environment (repeat).")] = None,
    export: Annotated[str | None, typer.Option("--export", help="Copy these variables of yours: VAR,VAR.")] = None,
    time_limit: Annotated[
        str | None, typer.Option("--time", "-t", help="Walltime: 2h, 90m, 1:30:00 or seconds; stopped past it.")
    ] = None,
    array: Annotated[
        str | None, typer.Option("--array", help="A job array: 0-9, 0-9:2, 1,3,5; %N runs at most N at once.")
    ] = None,
    dependency: Annotated[
        str | None, typer.Option("--dependency", "-d", help="afterok:ID[:ID], afterany:ID or afternotok:ID.")
    ] = None,
    hold: Annotated[bool, typer.Option("--hold", help="Submit held: not scheduled until tessera release.")] = False,
    workers: Annotated[
        int | None,
        typer.Option("--workers", "-N", help="Workers (ranks), each with --gpus GPUs, started together (a gang)."),
    ] = None,
    elastic: Annotated[
        str | None, typer.Option("--elastic", help="Elastic MIN-MAX workers: grows into idle GPUs, shrinks for others.")
    ] = None,
    job_type: Annotated[
        str | None, typer.Option("--job-type", help="The model it trains, e.g. ResNet-50 (tessera config lists them).")
    ] = None,
    checkpointable: Annotated[
        bool | None,
        typer.Option(
            "--checkpointable/--no-checkpointable",
            help="It resumes from its own checkpoints (default for a preemptible class), or it cannot.",
            show_default=False,
        ),
    ] = None,
    as_json: JsonOption = False,
    url: UrlOption = None,
    token: TokenOption = None,
) -> None:
    """Submit a workload: tessera submit --gpu-fraction 0.3 -- python train.py (it runs in this directory)"""
    with one_line_errors():
        loaded = load_spec_file(spec_file) if spec_file is not None else SpecFile(None, {}, {})
        body = dict(loaded.body)
        options = job_options(
            chdir=chdir, env=env, export=export, time_limit=time_limit, array=array, dependency=dependency, hold=hold
        )
        if "env" in options and isinstance(body.get("env"), dict):
            options["env"] = {**body["env"], **options["env"]}
        body.update(options)
        with_defaults(body)  # this directory, and this PATH
        flags: dict[str, Any] = {
            "gpus": gpus,
            "gpu_mem": gpu_mem,
            "gpu_milli": gpu_milli,
            "gpu_fraction": gpu_fraction,
            "gpu_compute": gpu_compute,
            "gpu_types": [t for t in gpu_type.split(",") if t.strip()] if gpu_type else None,
            "cpu": cpu,
            "mem": mem,
            "priority": int(priority) if priority and priority.lstrip("-").isdigit() else priority,
            "queue": queue,
            "name": name,
            "kind": kind,
            "command": list(command) if command else None,
            "workers": workers,
            "job_type": job_type,
            "checkpointable": checkpointable,
        }
        if elastic is not None:
            flags["elastic_min"], flags["elastic_max"] = elastic_range(elastic)
        body.update({k: v for k, v in flags.items() if v is not None})
        if "gpus" not in body and any(k in body for k in ("gpu_mem", "gpu_milli", "gpu_fraction", "gpu_compute")):
            body["gpus"] = 1  # a share without a count means one GPU
        if "gpus" not in body and body.get("gpu_types"):
            body["gpus"] = 1  # so does a GPU type: a user naming one wants a GPU, not a CPU-only workload
        if not body.get("command"):
            raise ApiError(0, "command: nothing to run; put it after --, e.g. tessera submit -- python train.py")
        with client_for(url, token) as client:
            try:
                created = client.submit(body)
            except ApiError as exc:
                raise loaded.locate(exc) from None
        if as_json:
            typer.echo(json.dumps(created))
        elif created.get("array_id") is not None:
            typer.echo(
                f"submitted array {created['array_id']} to queue {created['queue']} ({created['state']}; "
                f"tessera jobs --array {created['array_id']} lists its workloads)"
            )
        else:
            typer.echo(f"submitted workload {created['id']} to queue {created['queue']} ({created['state']})")


def jobs(
    as_json: JsonOption = False,
    all_states: Annotated[bool, typer.Option("--all", "-a", help="Include ended workloads.")] = False,
    queue: Annotated[str | None, typer.Option("--queue", help="Only this queue.")] = None,
    array: Annotated[int | None, typer.Option("--array", help="Only the tasks of this array.")] = None,
    url: UrlOption = None,
    token: TokenOption = None,
) -> None:
    """List workloads (pending and running; --all for ended ones too)."""
    with one_line_errors(), client_for(url, token) as client:
        states = None if all_states else ["pending", "running"]
        rows = client.workloads(states, queue, array=array)
        if queue is not None and not rows:  # nothing of that queue: is there such a queue (that you may see)?
            known = sorted(q["name"] for q in client.queues())
            if queue not in known:
                raise InvalidRequestError("--queue", f"no queue {queue!r} (yours: {', '.join(known) or 'none'})")
        if as_json:
            typer.echo(json.dumps(rows))
            return
        from rich.console import Console  # after the call: an unreachable server is reported without loading rich
        from rich.markup import escape
        from rich.table import Table

        console = Console()
        table = Table(box=None, header_style="bold", pad_edge=False)
        now = time.time()
        # In a narrow terminal (or a pipe: 80 columns) the id, state, GPUs, share and time keep their full width, the
        # name and the reason share what is left (cut with an ellipsis), and under 72 columns the share and time are
        # left out (--json has everything).
        wide = console.width >= 72
        fixed = ["ID", "QUEUE", "STATE", "GPUS"] + (["SHARE", "TIME"] if wide else [])
        records = []
        for w in rows:
            name = escape(w["name"] or " ".join(w["command"])[:30]) + _task(w)
            cells = {"ID": str(w["id"]), "QUEUE": w["queue"][:12], "STATE": w["state"], "GPUS": str(w["gpus"])}
            cells |= {"SHARE": _share(w), "TIME": _elapsed(w, now), "NAME": name, "WHERE / WHY": escape(_where(w))}
            records.append(cells)
        widths = {c: max([len(c)] + [len(r[c]) for r in records]) for c in fixed}
        left = console.width - sum(widths.values()) - 2 * (len(fixed) + 1)
        name_width = max(6, min(30, left * 2 // 5))
        for column in ["ID", "NAME", "QUEUE", "STATE", "GPUS"] + (["SHARE", "TIME"] if wide else []) + ["WHERE / WHY"]:
            if column in widths:
                table.add_column(column, no_wrap=True, min_width=widths[column])
            else:
                limit = name_width if column == "NAME" else max(6, left - name_width)
                table.add_column(column, no_wrap=True, overflow="ellipsis", max_width=limit)
        for r in records:
            table.add_row(*(r[str(c.header)] for c in table.columns))
        console.print(table)


def show(
    workload_id: Annotated[int, typer.Argument(help="Workload id.")],
    as_json: JsonOption = False,
    url: UrlOption = None,
    token: TokenOption = None,
) -> None:
    """One workload: its request, state, placement, and why it is pending or how it ended."""
    from rich.console import Console
    from rich.markup import escape

    with one_line_errors(), client_for(url, token) as client:
        w = client.workload(workload_id)
        if as_json:
            typer.echo(json.dumps(w))
            return
        console = Console(highlight=False)
        console.print(f"[bold]workload {w['id']}[/bold] {escape(w['name'])}  state: [bold]{w['state']}[/bold]")
        console.print(f"  queue {w['queue']} (tenant {w['tenant']}), priority {w['priority']} {w['priority_class']}")
        console.print(f"  command: {escape(' '.join(w['command']))}")
        console.print(
            f"  request: {w['gpus']} GPU(s), share {_share(w)}, {w['cpu_milli'] / 1000:g} CPU, "
            f"{w['mem_mib']} MiB" + (f", types {','.join(w['gpu_types'])}" if w["gpu_types"] else "")
        )
        if _shape(w):
            console.print(f"  {escape(_shape(w))}")
        if w.get("cwd"):
            console.print(f"  directory: {escape(w['cwd'])}")
        if _options(w):
            console.print(f"  options: {escape(_options(w))}")
        if w["reason"]:
            label = "why pending" if w["state"] == "pending" else "reason"
            console.print(f"  {label}: {escape(w['reason'])}")
        if w["placement"]:
            sim = " (simulated GPUs)" if w["simulated_gpus"] else ""
            console.print(f"  placed: {escape(_where(w))}{sim}")
        if w["exit_code"] is not None:
            console.print(f"  exit code: {w['exit_code']}")
        for event in client.events(workload_id)[-10:]:
            stamp = time.strftime("%H:%M:%S", time.localtime(event["at"]))
            console.print(f"  {stamp} {event['kind']}: {escape(event['message'])}")


def _shape(w: dict[str, Any]) -> str:
    """Workers (now, asked, elastic range), job type and checkpointing, when any differs from one plain worker."""
    asked = w.get("workers_asked", 1)
    parts = []
    if w.get("elastic_min") is not None:
        elastic = f"{w['elastic_min']}-{w['elastic_max']}"
        parts.append(f"workers: {w.get('workers', asked)} (asked {asked}, elastic {elastic})")
    elif asked > 1:
        parts.append(f"workers: {asked} (a gang: tessera logs --rank R)")
    if w.get("job_type"):
        parts.append(f"job type {w['job_type']}")
    if w.get("checkpointable"):
        parts.append("checkpointable")
    return ", ".join(parts)


def nodes(url: UrlOption = None, token: TokenOption = None, as_json: JsonOption = False) -> None:
    """Nodes and per-GPU allocation."""
    from rich.console import Console
    from rich.markup import escape

    with one_line_errors(), client_for(url, token) as client:
        found = client.nodes()
        if as_json:
            typer.echo(json.dumps(found))
            return
        console = Console(highlight=False)
        for node in found:
            console.print(
                f"[bold]{escape(node['name'])}[/bold]  CPU {node['cpu_free_milli'] / 1000:g}/"
                f"{node['cpu_milli'] / 1000:g} free  memory {node['mem_free_mib']}/{node['mem_mib']} MiB free"
            )
            for gpu in node["gpus"]:
                label = " [yellow](simulated)[/yellow]" if gpu["simulated"] else ""
                used = gpu["allocated_milli"]
                on = ",".join(str(w) for w in gpu["workloads"]) or "-"
                console.print(
                    f"  GPU {gpu['index']} {gpu['model']}{label} {_bar(used)} {used / 10:5.1f}%  "
                    f"workloads {on}  {escape(gpu['uuid'])}",
                    soft_wrap=True,
                )


@token_app.command("create")
def token_create(
    tenant: Annotated[str, typer.Option("--tenant", help="Tenant the token acts for.")],
    label: Annotated[str, typer.Option("--label", help="A note to recognise the token by.")] = "",
    as_json: JsonOption = False,
    url: UrlOption = None,
    token: TokenOption = None,
) -> None:
    """Create a token for a tenant (printed once; the server keeps only its hash)."""
    with one_line_errors(), client_for(url, token) as client:
        created = client.create_token(tenant, label)
        if as_json:
            typer.echo(json.dumps(created))
        else:
            typer.echo(f"token for tenant {created['tenant']} (queue {created['queue']}), shown once:")
            typer.echo(created["token"])


@token_app.command("list")
def token_list(as_json: JsonOption = False, url: UrlOption = None, token: TokenOption = None) -> None:
    """Stored tokens, without their secrets: id, tenant, label, admin or not, when made and last used."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    with one_line_errors(), client_for(url, token) as client:
        found = client.tokens()
        if as_json:
            typer.echo(json.dumps(found))
            return
        table = Table(box=None, header_style="bold")
        for column in ("ID", "TENANT", "ADMIN", "LABEL", "CREATED", "LAST USED"):
            table.add_column(column)
        for t in found:
            table.add_row(
                str(t["id"]),
                escape(t["tenant"] or "-"),
                "yes" if t["admin"] else "no",
                escape(t["label"]),
                _stamp(t["created_at"]),
                _stamp(t["last_used_at"]) if t["last_used_at"] is not None else "never",
            )
        Console().print(table)


@token_app.command("revoke")
def token_revoke(
    token_id: Annotated[int, typer.Argument(help="Token id (tessera token list).")],
    url: UrlOption = None,
    token: TokenOption = None,
) -> None:
    """Revoke a token: it stops working at once (the admin token is rotated by restarting with a new one)."""
    with one_line_errors(), client_for(url, token) as client:
        revoked = client.revoke_token(token_id)
        who = "admin" if revoked["admin"] else f"tenant {revoked['tenant']}"
        typer.echo(f"token {revoked['id']} ({who}) revoked")


def _share(w: dict[str, Any]) -> str:
    if not w["gpus"]:
        return "-"
    if w["gpu_milli"] and w["gpu_milli"] < 1000:
        return f"{w['gpu_milli'] / 10:g}%"
    if w["gpu_mem_mib"] and not w["gpu_milli"]:
        return f"{w['gpu_mem_mib']} MiB"
    return "whole"


def _where(w: dict[str, Any]) -> str:
    if w["state"] == "running" and w["placement"]:
        return "; ".join(
            f"{p['node']} GPU {','.join(map(str, p['gpus']))}" if p["gpus"] else f"{p['node']} (CPU)"
            for p in w["placement"]
        )
    return str(w["reason"])


def _options(w: dict[str, Any]) -> str:
    """The job options ``show`` prints: walltime, dependency, array, held."""
    parts = []
    if w.get("time_limit_s") is not None:
        parts.append(f"walltime {w['time_limit_s']:g}s")
    if w.get("dependency"):
        parts.append(f"dependency {w['dependency']}")
    if w.get("array_id") is not None:
        parts.append(f"array {w['array_id']} index {w['array_index']}")
    if w.get("held"):
        parts.append("held")
    return ", ".join(parts)


def _task(w: dict[str, Any]) -> str:
    """An array's task: ``[index]`` after its name."""
    return f"[{w['array_index']}]" if w.get("array_index") is not None else ""


def _stamp(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(at))


def _elapsed(w: dict[str, Any], now: float) -> str:
    start = w["started_at"] if w["state"] == "running" else w["submitted_at"]
    end = w["finished_at"] or now
    seconds = max(0, int(end - (start or now)))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}"


def _bar(milli: int, width: int = 20) -> str:
    filled = round(milli / 1000 * width)
    return "[" + "█" * filled + "·" * (width - filled) + "]"
