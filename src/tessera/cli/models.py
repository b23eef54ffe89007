"""``tessera models`` (list), ``tessera models deploy NAME``, ``tessera models show NAME``, ``tessera models stats
NAME`` and ``tessera models delete NAME``: models served on the shared pool behind the OpenAI-compatible gateway.
Registered on the main typer app by ``tessera.cli.main``; every failure is one ``error:`` line, exit 2.
"""

from __future__ import annotations

import json
import shlex
from typing import Annotated, Any

import typer

from tessera.cli.options import JsonOption, TokenOption, UrlOption, client_for, finite_float
from tessera.cli.terminal import fail, one_line_errors

models_app = typer.Typer(
    help="Serve models on the shared GPUs (OpenAI-compatible gateway).", invoke_without_command=True
)


@models_app.callback()
def list_models(
    ctx: typer.Context, as_json: JsonOption = False, url: UrlOption = None, token: TokenOption = None
) -> None:
    """List your models: state, cache tier (hot, warm, cold), replicas ready, and the OpenAI base URL; a failing
    model's last error below it."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    if ctx.invoked_subcommand is not None:
        return
    with one_line_errors(), client_for(url, token) as client:
        models = client.models()
    if as_json:
        typer.echo(json.dumps(models, indent=2))
        return
    if not models:
        typer.echo("no models deployed (tessera models deploy NAME --engine sim)")
        return
    table = Table("NAME", "TENANT", "ENGINE", "STATE", "CACHE", "REPLICAS", "SHARE", "SLO")
    table.add_column("OPENAI BASE URL", overflow="fold")
    failing = []
    for m in models:
        replicas = f"{m['replicas']}/{m['desired_replicas']} ({m['min_replicas']}-{m['max_replicas']})"
        table.add_row(
            escape(m["name"]), escape(m["tenant"]), m["engine"], m["state"], m.get("cache", "-"), replicas, _share(m),
            m["slo"],
            m["openai_base_url"],
        )  # fmt: skip
        if m.get("last_error"):
            failing.append(f"{m['name']}: {m['replica_failures']} replica failures in a row; last: {m['last_error']}")
    console = Console()
    console.print(table)
    for line in failing:
        console.print(escape(line), style="red", soft_wrap=True)


@models_app.command("deploy")
def deploy(
    name: Annotated[str, typer.Argument(help="The model's name in OpenAI requests.")],
    engine: Annotated[str, typer.Option("--engine", help="vllm, sglang, transformers or sim.")] = "sim",
    model: Annotated[str | None, typer.Option("--model", help="Weights: a local folder (sim: a catalog name).")] = None,
    gpus: Annotated[int, typer.Option("--gpus", help="GPUs per replica (0: CPU).")] = 1,
    gpu_mem: Annotated[str | None, typer.Option("--gpu-mem", help="Device memory per replica, e.g. 20GiB.")] = None,
    gpu_fraction: Annotated[
        float | None, typer.Option("--gpu-fraction", parser=finite_float, help="Share of the GPU, e.g. 0.25.")
    ] = None,
    min_replicas: Annotated[int, typer.Option("--min-replicas", help="0: scale to zero when idle.")] = 1,
    max_replicas: Annotated[int | None, typer.Option("--max-replicas", help="Default: max(1, min).")] = None,
    idle_timeout: Annotated[str, typer.Option("--idle-timeout", help="Idle time before scaling to zero.")] = "30s",
    slo: Annotated[str, typer.Option("--slo", help="interactive, standard or batch.")] = "standard",
    router: Annotated[
        str | None,
        typer.Option(
            "--router",
            help="prefix-affinity, least-load, power-of-two, ... (as the twin; default: the server's setup).",
        ),
    ] = None,
    autoscaler: Annotated[
        str | None,
        typer.Option("--autoscaler", help="tessera, knative or none (fixed); default: the server's serving setup's."),
    ] = None,
    queue: Annotated[str | None, typer.Option("--queue", help="Queue (default: your tenant's).")] = None,
    engine_arg: Annotated[
        list[str] | None,
        typer.Option(
            "--engine-arg",
            help="The engine's own arguments, split as a shell would (repeatable): --engine-arg '--dtype float32'.",
        ),
    ] = None,
    cpus: Annotated[str | None, typer.Option("--cpus", help="CPU cores per replica (4, 0.5, 500m).")] = None,
    cpu_bind: Annotated[
        str | None, typer.Option("--cpu-bind", help="Cores a CPU replica binds among (0-3,8), or none.")
    ] = None,
    kv_offload_gib: Annotated[
        float | None, typer.Option("--kv-offload-gib", parser=finite_float, help="vllm: KV offload to host, GiB.")
    ] = None,
    kv_events: Annotated[bool, typer.Option("--kv-events", help="vllm: publish KV-cache events.")] = False,
    as_json: JsonOption = False,
    url: UrlOption = None,
    token: TokenOption = None,
) -> None:
    """Deploy a model: tessera models deploy chat --engine sim --gpu-fraction 0.25 --min-replicas 0"""
    body: dict[str, Any] = {
        "name": name,
        "engine": engine,
        "model": model,
        "gpus": gpus,
        "gpu_mem": gpu_mem,
        "gpu_fraction": gpu_fraction,
        "min_replicas": min_replicas,
        "max_replicas": max_replicas,
        "idle_timeout": idle_timeout,
        "slo": slo,
        "router": router,
        "autoscaler": autoscaler,
        "queue": queue,
        "engine_args": _engine_args(engine_arg or []) or None,
        "cpus": cpus,
        "cpu_bind": cpu_bind,
        "kv_offload_gib": kv_offload_gib,
        "kv_events": kv_events or None,
    }
    with one_line_errors(), client_for(url, token) as client:
        out = client.deploy_model({k: v for k, v in body.items() if v is not None})
    if as_json:
        typer.echo(json.dumps(out, indent=2))
        return
    typer.echo(
        f"model {out['name']} deployed ({out['engine']}, {out['min_replicas']}-{out['max_replicas']} replicas; "
        f"router {out['router']}, autoscaler {out['autoscaler']}: setup {out['serving_setup']})"
    )
    typer.echo(f"OpenAI base URL: {out['openai_base_url']}  (API key: your Tessera token)")


@models_app.command("show")
def show(
    name: Annotated[str, typer.Argument(help="The model to show.")],
    as_json: JsonOption = False,
    url: UrlOption = None,
    token: TokenOption = None,
) -> None:
    """Show one model: its state, replicas, share, router and engine settings."""
    with one_line_errors(), client_for(url, token) as client:
        m = client.model(name)
    if as_json:
        typer.echo(json.dumps(m, indent=2))
        return
    replicas = f"{m['replicas']} ready of {m['desired_replicas']} ({m['min_replicas']}-{m['max_replicas']})"
    lines = [
        ("name", m["name"]), ("tenant", m["tenant"]), ("engine", m["engine"]), ("weights", m["model"] or "-"),
        ("state", m["state"]), ("replicas", replicas), ("share", _share(m)), ("slo", m["slo"]),
        ("router", m.get("router", "least-load")), *engine_lines(m), ("openai base url", m["openai_base_url"]),
    ]  # fmt: skip
    if m.get("last_error"):
        lines.append(("last error", m["last_error"]))
    for key, value in lines:
        typer.echo(f"{key + ':':<17}{value}")


def engine_lines(m: dict[str, Any]) -> list[tuple[str, str]]:
    """The model's own engine settings, as ``models show`` prints them."""
    cpu = f"{m['cpu_milli'] / 1000:g}" if m.get("cpu_milli") else "-"
    bind = m.get("cpu_bind") or "any"
    kv = [f"offload {m['kv_offload_gib']:g} GiB"] if m.get("kv_offload_gib") else []
    kv += ["events"] if m.get("kv_events") else []
    return [
        ("engine args", shlex.join(m.get("engine_args") or []) or "-"),
        ("cpus", f"{cpu} (binds among: {bind})"),
        ("kv", ", ".join(kv) or "-"),
    ]


def _engine_args(values: list[str]) -> list[str]:
    """Each ``--engine-arg`` split as a shell would (``TESSERA_<ENGINE>_ARGS`` are too); a bad one: one line."""
    args: list[str] = []
    for value in values:
        try:
            args += shlex.split(value)
        except ValueError as exc:
            fail(f"--engine-arg {value!r}: {exc}")
    return args


@models_app.command("delete")
def delete(
    name: Annotated[str, typer.Argument(help="The model to delete.")],
    url: UrlOption = None,
    token: TokenOption = None,
) -> None:
    """Delete a model: its replicas are stopped, then it is gone."""
    with one_line_errors(), client_for(url, token) as client:
        out = client.delete_model(name)
    typer.echo(f"model {out['name']}: deleting ({len(out['replica_workloads'])} replicas stopping)")


@models_app.command("stats")
def stats(
    name: Annotated[str, typer.Argument(help="The model.")],
    as_json: JsonOption = False,
    url: UrlOption = None,
    token: TokenOption = None,
) -> None:
    """A model's requests over the last few minutes (rate, TTFT and TPOT percentiles against its SLO, errors), its
    replicas and its setup."""
    from tessera.cli.model_stats import stats_lines

    with one_line_errors(), client_for(url, token) as client:
        out = client.model_stats(name)
    if as_json:
        typer.echo(json.dumps(out, indent=2))
        return
    for line in stats_lines(out):
        typer.echo(line)


def _share(m: dict[str, Any]) -> str:
    cpus = f"{m['cpu_milli'] / 1000:g} CPU" if m.get("cpu_milli") else ""
    if not m["gpus"]:
        return cpus or "CPU"
    per = f"{m['gpu_milli'] / 10:g}%" if m["gpu_milli"] else f"{m['gpu_mem_mib']} MiB" if m["gpu_mem_mib"] else "whole"
    share = per if m["gpus"] == 1 else f"{m['gpus']} x {per}"
    return f"{share} + {cpus}" if cpus else share
