"""The ``tessera`` command line: a thin typer adapter over ``tessera.sim``.

Commands:

- ``tessera simulate fgd``: the FGD study's arrival-inflation experiment for several policies and seeds, with a
  report (CSV, JSON, Markdown, PNG) in ``--out``;
- ``tessera simulate serving``: LLM serving policies replayed on a request trace (``tessera.cli.serving``);
- ``tessera bench placement``: placement speed of one policy, or of several in lockstep, on the inflated arrival
  sequence, one JSON line per policy.

Every ``TesseraError`` (bad input file, bad option value) and every unreadable path becomes one line on stderr,
``error: <message>``, and exit code 2, without a traceback.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from tessera.cli import lean_typer
from tessera.cli.lazy import LazyGroup
from tessera.cli.options import BEFORE_COMMAND, NodesOption, PodsOption, TokenOption, UrlOption, finite_float
from tessera.cli.serving import register as register_serving_command
from tessera.cli.settings import DEFAULT_PORT
from tessera.cli.terminal import one_line_errors, run_app
from tessera.cli.timeline import register as register_timeline_command
from tessera.core.errors import InvalidRequestError

# The simulator (matplotlib), the placement policies (scipy), the presets and the server (FastAPI, SQLAlchemy) load
# only in the commands that use them, so that the API commands (tessera jobs, submit, ...) start quickly: importing
# tessera.core.placement alone costs about 0.7 s (scipy.optimize). Each subcommand's module, and rich, load only
# when that command is named (tessera.cli.lazy). tests/cli/test_startup.py keeps it that way.
if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

    from tessera.sim.placement_study.inputs import ExperimentInputs
    from tessera.sim.placement_study.sweep import RunResult
    from tessera.sim.reports.placement_study import PolicySummary, ReportFiles

lean_typer.install()  # typer without pydantic, Markdown and Pygments until they are needed (tessera.cli.lean_typer)


class Commands(LazyGroup):
    """``tessera``'s subcommands, in the order of ``tessera --help``: each module loads when its command is named."""

    subcommands = {
        "submit": "tessera.cli.commands:submit",
        "jobs": "tessera.cli.commands:jobs",
        "show": "tessera.cli.commands:show",
        "logs": "tessera.cli.logs:logs",
        "cancel": "tessera.cli.job_control:cancel",
        "hold": "tessera.cli.job_control:hold",
        "release": "tessera.cli.job_control:release",
        "nodes": "tessera.cli.commands:nodes",
        "history": "tessera.cli.history:history",
        "up": "tessera.cli.main:up",
        "simulate": "tessera.cli.main:simulate_app",
        "bench": "tessera.cli.bench:bench_app",
        "queues": "tessera.cli.queues:queues_app",
        "token": "tessera.cli.commands:token_app",
        "models": "tessera.cli.models:models_app",
    }


app = typer.Typer(
    cls=Commands,
    help="Tessera: fractional, fragmentation-aware GPU scheduling and its trace-driven simulator.",
    no_args_is_help=True,
    add_completion=True,  # tessera --install-completion (bash, zsh, fish, PowerShell); docs/cli.md
    pretty_exceptions_enable=False,
)
Commands.pretty_exceptions_short = app.pretty_exceptions_short


@app.callback()
def _root(url: UrlOption = None, token: TokenOption = None) -> None:
    """``--url`` and ``--token`` before the subcommand (``tessera --token X jobs``) count as if given after it
    (``tessera.cli.options``); a command's own win. The callback also makes typer build a group although no command
    is registered on the app itself."""
    BEFORE_COMMAND.url, BEFORE_COMMAND.token = url, token


simulate_app = typer.Typer(help="Run simulation experiments.", no_args_is_help=True)

InflateOption = Annotated[
    float,
    typer.Option(
        "--inflate", parser=finite_float, help="Stop arrivals at this multiple of the cluster's GPU capacity."
    ),
]


@simulate_app.command("fgd")
def simulate_fgd(
    out: Annotated[Path, typer.Option("--out", help="Folder for runs.csv, summary.json, summary.md, unallocated.png.")],
    nodes: NodesOption = None,
    pods: PodsOption = None,
    policies: Annotated[
        str | None,
        typer.Option(
            "--policies",
            help="Comma-separated placement policies (default: the FGD study's six and tessera).",
            show_default=False,
        ),
    ] = None,
    seeds: Annotated[str, typer.Option("--seeds", help="Seeds: a range 42-51, a list 42,43,50 or one.")] = "42-51",
    inflate: InflateOption = 1.3,
    jobs: Annotated[int | None, typer.Option("--jobs", help="Worker processes (default: the number of CPUs).")] = None,
) -> None:
    """The FGD paper's arrival-inflation experiment: unallocated GPU % per policy, mean over seeds."""
    from rich.console import Console
    from rich.markup import escape

    from tessera.core.placement import FGD_STUDY_POLICIES
    from tessera.sim.placement_study.inputs import load_inputs
    from tessera.sim.placement_study.sweep import check_inflate, parse_policies, parse_seeds
    from tessera.sim.reports.placement_study import format_seeds, summarize, write_report

    with one_line_errors():
        policy_names = parse_policies(policies if policies is not None else ",".join((*FGD_STUDY_POLICIES, "tessera")))
        seed_list = parse_seeds(seeds)
        check_inflate(inflate)
        workers = jobs if jobs is not None else (os.cpu_count() or 1)
        if workers < 1:
            raise InvalidRequestError("--jobs", f"must be >= 1, got {workers}")
        inputs = load_inputs(nodes, pods)
        out.mkdir(parents=True, exist_ok=True)  # fail on an unusable --out before the runs, not after
        console = Console()
        console.print(
            f"[bold]{escape(inputs.trace)}[/]: {len(inputs.nodes):,} nodes, {inputs.gpus:,} GPUs, "
            f"{len(inputs.requests):,} pods; policies {', '.join(policy_names)}; seeds {format_seeds(seed_list)}; "
            f"inflation {inflate:g}x; {workers} worker(s)"
        )
        results = _sweep_with_progress(inputs, policy_names, seed_list, inflate, workers)
        files = write_report(out, inputs.trace, inputs.gpus, seed_list, results, inflate)
        console.print(_summary_table(inputs, seed_list, summarize(results)))
        _print_files(console, files)


def _sweep_with_progress(
    inputs: ExperimentInputs, policies: Sequence[str], seeds: Sequence[int], inflate: float, jobs: int
) -> list[RunResult]:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from tessera.sim.placement_study.sweep import run_sweep

    progress = Progress(
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
    )
    with progress:
        task = progress.add_task("simulating (policy, seed) runs", total=len(policies) * len(seeds))

        def advance(policy: str, seed: int) -> None:
            progress.update(task, advance=1, description=f"done {policy} seed {seed}")

        return run_sweep(inputs.nodes, inputs.requests, policies, seeds, inflate, jobs, advance)


def _summary_table(inputs: ExperimentInputs, seeds: Sequence[int], summaries: Sequence[PolicySummary]) -> Table:
    from rich.markup import escape
    from rich.table import Table

    from tessera.sim.reports.placement_study import format_mean_std, format_seeds

    table = Table(
        title=f"{escape(inputs.trace)}: {inputs.gpus:,} GPUs, seeds {format_seeds(seeds)} (mean ± std)",
        title_justify="left",
    )
    table.add_column("policy", style="bold")
    table.add_column("unalloc. % @100%", justify="right")
    table.add_column("unalloc. % @130%", justify="right")
    table.add_column("pods/s", justify="right")
    for s in summaries:
        table.add_row(
            s.policy,
            format_mean_std(s.unallocated_pct[100], s.unallocated_pct_std[100]),
            format_mean_std(s.unallocated_pct[130], s.unallocated_pct_std[130]),
            f"{s.pods_per_s:,.0f}",
        )
    return table


def _print_files(console: Console, files: ReportFiles) -> None:
    from rich.markup import escape

    console.print(f"Report written to [bold]{escape(str(files.summary_md.parent))}[/]:")
    for path in files.all():
        console.print(f"  {path}", soft_wrap=True, markup=False, highlight=False)


register_timeline_command(simulate_app)
register_serving_command(simulate_app)


@app.command("up")
def up(
    host: Annotated[str, typer.Option("--host", help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="Port to listen on.")] = DEFAULT_PORT,
    db: Annotated[
        str | None,
        typer.Option("--db", help="Database URL without a password (default: $TESSERA_DB, else SQLite in --data-dir)."),
    ] = None,
    gpus: Annotated[
        str, typer.Option("--gpus", help="auto (NVML, else simulated) or a pool like 4xA100-80GB,2xT4.")
    ] = "auto",
    admin_token: Annotated[str | None, typer.Option("--admin-token", hidden=True)] = None,
    admin_token_file: Annotated[
        Path | None,
        typer.Option(
            "--admin-token-file",
            help="File holding the admin token (default: $TESSERA_ADMIN_TOKEN, else generated and printed once).",
        ),
    ] = None,
    data_dir: Annotated[Path, typer.Option("--data-dir", help="Store, logs and process files.")] = Path(".tessera"),
    policy: Annotated[
        str,
        typer.Option("--policy", help="Scheduling policy: tessera, static, fifo-share, tiresias, gavel or a variant."),
    ] = "tessera",
    placement: Annotated[
        str | None, typer.Option("--placement", help="Placement policy instead of the policy's own (e.g. fgd).")
    ] = None,
    demo: Annotated[bool, typer.Option("--demo", help="Submit a small demo mix once ready (make run).")] = False,
    run_as: Annotated[
        str,
        typer.Option(
            "--run-as",
            help="Who workloads run as: tenant-users (root only), server, or auto (tenant-users as root; the server's "
            "user with --demo, whose workloads run this Python).",
        ),
    ] = "auto",
    tenant_user: Annotated[
        list[str] | None,
        typer.Option("--tenant-user", help="TENANT=USER: run TENANT's workloads as this existing OS user (repeat)."),
    ] = None,
    homes_dir: Annotated[
        Path | None,
        typer.Option("--homes-dir", help="Home directories of the tenants' users (default: DATA_DIR/homes)."),
    ] = None,
    backend: Annotated[
        str, typer.Option("--backend", help="Where workloads run: local (this host) or ray (a Ray cluster).")
    ] = "local",
    ray_address: Annotated[
        str | None,
        typer.Option("--ray-address", help="With --backend ray: the cluster (host:port); default: start a local one."),
    ] = None,
    log_max_size: Annotated[
        str,
        typer.Option(
            "--log-max-size",
            help="Rotate a workload's log before it passes this size (one rotated file kept; 0: never), e.g. 64MiB.",
        ),
    ] = "64MiB",
    pids_max: Annotated[
        int | None,
        typer.Option("--workload-pids-max", help="Processes and threads per workload (default 4096; 0: no limit)."),
    ] = None,
    mem_per_gpu: Annotated[
        str,
        typer.Option(
            "--workload-mem-per-gpu",
            help="Memory limit of a workload without --mem, per GPU it is on (auto: the node's memory / its GPUs).",
        ),
    ] = "auto",
    knobs: Annotated[
        list[str] | None,
        typer.Option(
            "--set", help="A knob of the policy, KEY=VALUE (repeat; GET /v1/config lists them), e.g. elastic=false."
        ),
    ] = None,
    serving_setup: Annotated[
        str,
        typer.Option(
            "--serving-setup",
            help="The serving setup the gateway and controller run: tessera, static-autoscale or static (as tessera "
            "simulate serving --setup).",
        ),
    ] = "tessera",
    serving_knobs: Annotated[
        list[str] | None,
        typer.Option(
            "--serving-set",
            help="A knob of the serving setup, KEY=VALUE (repeat; as simulate serving --set), e.g. router=least-load.",
        ),
    ] = None,
    gavel: Annotated[
        Path | None,
        typer.Option(
            "--gavel",
            help="Folder with Gavel's throughput CSV files for --job-type (as simulate timeline --traces DIR/gavel); "
            "default: the embedded tables.",
        ),
    ] = None,
) -> None:
    """Start the control plane: HTTP API, scheduler loop and local backend in one process."""
    import logging

    from tessera.cli.gateway_up import serving_front
    from tessera.cli.up_secrets import admin_token_of, database_url, tenant_users
    from tessera.core.placement import make_policy
    from tessera.core.preset_knobs import with_knobs
    from tessera.core.presets import resolve_preset
    from tessera.server.logfiles import parse_size_bytes
    from tessera.server.loop_values import LoopConfig
    from tessera.server.quantities import parse_mem_mib
    from tessera.server.up import UpConfig, serve
    from tessera.server.workload_limits import WorkloadLimits

    with one_line_errors():
        with_knobs(resolve_preset(policy, "--policy"), knobs or ())  # fail early on an unknown name or knob
        if placement is not None:
            make_policy(placement)
        token = admin_token_of(admin_token, admin_token_file, os.environ)
        url = database_url(db, os.environ)
        mem_per_gpu_mib = 0 if mem_per_gpu == "auto" else parse_mem_mib(mem_per_gpu, "--workload-mem-per-gpu")
        log_max_bytes = parse_size_bytes(log_max_size, "--log-max-size")
        pids = {} if pids_max is None else {"pids_max": pids_max}  # else the default (WorkloadLimits)
        limits = WorkloadLimits(mem_per_gpu_mib=mem_per_gpu_mib, log_max_bytes=log_max_bytes, **pids)
        job_models = None
        if gavel is not None:
            from tessera.sim.workloads.gavel import load_gavel_models

            job_models = load_gavel_models(gavel)
        loop = LoopConfig(
            run_dir=data_dir,
            policy=policy,
            knobs=tuple(knobs or ()),
            placement=placement,
            limits=limits,
            job_models=job_models,
        )
        users = tenant_users(tenant_user or [])
        if demo and run_as == "auto":  # the demo's workloads run this interpreter, which tenant users may not reach
            run_as = "server"
        config = UpConfig(
            host, port, data_dir, url, gpus, token, loop, run_as, users, homes_dir, backend, ray_address,
            serving_setup, tuple(serving_knobs or ()),
        )  # fmt: skip
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        for chatty in ("httpx", "alembic"):
            logging.getLogger(chatty).setLevel(logging.WARNING)
        serve(config, announce=typer.echo, demo=demo, serving=serving_front)


def main() -> None:
    """Console-script entry point (``tessera``): errors typer finds itself end as one line too (``run_app``)."""
    run_app(app)


if __name__ == "__main__":
    main()
