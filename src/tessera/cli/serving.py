"""``tessera simulate serving``: replay an LLM request trace on a simulated GPU cluster under several serving
policies, and write the report.

Registered on ``tessera simulate`` by ``tessera.cli.main``. The command builds a ``StudyConfig`` from its options,
runs ``tessera.sim.serving.study.run_study`` with a progress bar per (policy, seed), writes the report
(``tessera.sim.serving.report``) and prints ``summary.md`` and the paths written. Bad input (a malformed trace line,
an unknown policy, an out-of-range option) is one ``error:`` line and exit code 2. The simulator and matplotlib
load only when the command runs, so that the other commands start quickly.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from tessera.cli.options import finite_float
from tessera.cli.terminal import one_line_errors

if TYPE_CHECKING:  # rich, like the simulator, loads when the command runs
    from rich.progress import Progress, TaskID

    from tessera.sim.serving.config import StudyConfig
    from tessera.sim.serving.result import PolicyRun

DEFAULT_POLICIES = "static,static-autoscale,tessera"


def simulate_serving(
    out: Annotated[Path, typer.Option("--out", help="Folder for summary.json, summary.md, runs.csv and the plots.")],
    trace: Annotated[
        Path | None,
        typer.Option(
            "--trace",
            help="Request trace: Azure LLM (TIMESTAMP,ContextTokens,GeneratedTokens) or Splitwise format. "
            "Default: a seeded synthetic Azure-like trace (one hour, ~5.5 requests/s).",
        ),
    ] = None,
    models: Annotated[int, typer.Option("--models", help="Models to split the trace into (1..256).")] = 8,
    zipf: Annotated[
        float, typer.Option("--zipf", parser=finite_float, help="Zipf exponent of the models' popularity (>= 0).")
    ] = 1.0,
    load: Annotated[
        float, typer.Option("--load", parser=finite_float, help="Multiple of the trace's arrival rate (0 < X <= 100).")
    ] = 1.0,
    policies: Annotated[
        str,
        typer.Option(
            "--setup", "--policies", help="Serving setups, comma-separated: static, static-autoscale, tessera."
        ),
    ] = DEFAULT_POLICIES,
    knobs: Annotated[
        list[str] | None,
        typer.Option(
            "--set",
            help="A knob of every setup, KEY=VALUE (repeat): router, autoscaler, admission, engine_priority, "
            "late_binding, tick_s, max_hold_s (as tessera up --serving-set).",
        ),
    ] = None,
    seeds: Annotated[str, typer.Option("--seeds", help="Seeds: a range 0-2, a list 0,1,5 or one.")] = "0",
    gpus: Annotated[
        str | None,
        typer.Option("--gpus", help="A fixed cluster, e.g. 64xH100-80GB (nodes of 8). Default: sized per policy."),
    ] = None,
    gpus_for_slo: Annotated[
        bool,
        typer.Option("--gpus-for-slo", help="Per policy, the smallest cluster meeting the SLOs (not with --gpus)."),
    ] = False,
    perf_profile: Annotated[
        Path | None, typer.Option("--perf-profile", help="Your engine's measured latencies (CSV) for the perf model.")
    ] = None,
    model_mix: Annotated[
        str | None,
        typer.Option(
            "--model-mix",
            help="Models by popularity rank, repeated to --models, e.g. llama2-13b,mine. Default: "
            "llama2-13b,llama3-8b,llama2-70b,llama2-7b,llama2-13b,llama3-8b,codellama-34b,llama2-7b.",
        ),
    ] = None,
    model_config: Annotated[
        list[str] | None,
        typer.Option(
            "--model-config",
            help="NAME=config.json: bring a model by its Hugging Face architecture (repeat). Name it in --model-mix.",
        ),
    ] = None,
    model_profile: Annotated[
        list[str] | None,
        typer.Option(
            "--model-profile",
            help="[NAME=]CSV: a model's measured timings, Splitwise perf-model rows (every model they hold) or a "
            "profile (kind,batch_size,tokens,kv_tokens,time_ms; NAME= needed) (repeat).",
        ),
    ] = None,
) -> None:
    """Serve a request trace with N models on shared GPUs: GPU-hours, SLO attainment and latency per policy."""
    from rich.console import Console
    from rich.markup import escape

    from tessera.sim.placement_study.sweep import parse_seeds
    from tessera.sim.serving.config import StudyConfig, parse_model_mix, parse_named_path, parse_policy_names
    from tessera.sim.serving.perf_choice import describe as describe_perf
    from tessera.sim.serving.report import write_serving_report
    from tessera.sim.serving.study import check_models_fit

    with one_line_errors():
        config = StudyConfig(
            trace=trace,
            models=models,
            zipf=zipf,
            load=load,
            policies=parse_policy_names(policies),
            seeds=tuple(parse_seeds(seeds)),
            gpus=gpus,
            gpus_for_slo=gpus_for_slo,
            perf_profile=perf_profile,
            out=out,
            model_mix=None if model_mix is None else parse_model_mix(model_mix),
            model_configs=tuple(_named(parse_named_path(t, "--model-config")) for t in model_config or ()),
            model_profiles=tuple(parse_named_path(t, "--model-profile", False) for t in model_profile or ()),
            knobs=tuple(knobs or ()),
        )
        book = config.model_book()  # a bad config.json or profile fails here, naming the file and the key
        requests = config.load_trace()  # a bad trace fails here, before anything is written or run
        check_models_fit(config)  # so does a model too big for the --gpus model
        out.mkdir(parents=True, exist_ok=True)  # and an unusable --out before the runs, not after
        console = Console()
        cluster = gpus or ("smallest meeting the SLOs" if gpus_for_slo else "sized per policy")
        console.print(
            f"[bold]{escape(config.trace_name)}[/]: {len(requests):,} requests over {requests.duration_s / 60:.1f} min "
            f"({requests.rate_per_s:.2f}/s); {models} models, Zipf {zipf:g}, load {load:g}x; "
            f"policies {', '.join(config.policies)}; seeds {', '.join(map(str, config.seeds))}; "
            f"cluster {escape(cluster)}"
        )
        if config.model_mix is not None or config.model_configs or config.model_profiles:
            timing = describe_perf(config.perf_profile)
            for name in dict.fromkeys(config.mix[: config.models]):
                console.print(book.describe(name, timing), markup=False, highlight=False, soft_wrap=True)
        runs = _run_with_progress(config)
        paths = write_serving_report(out, config, config.trace_name, runs)
        console.print((out / "summary.md").read_text(), markup=False, highlight=False, soft_wrap=True)
        console.print(
            "Report written to:", *[str(p) for p in paths], sep="\n  ", markup=False, highlight=False, soft_wrap=True
        )


def _named(pair: tuple[str | None, Path]) -> tuple[str, Path]:
    name, path = pair
    assert name is not None  # parse_named_path requires one for --model-config
    return name, path


def _run_with_progress(config: StudyConfig) -> list[PolicyRun]:
    """The study's runs, with one progress bar per (policy, seed) advanced by the study's progress callback."""
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from tessera.sim.serving.study import run_study

    progress = Progress(
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        TextColumn("{task.percentage:>3.0f}%"),
        TimeElapsedColumn(),
        console=Console(stderr=True),
    )
    with progress:
        tasks = {
            f"{policy} seed {seed}": progress.add_task(f"{policy} seed {seed}", total=1.0)
            for seed in config.seeds
            for policy in config.policies
        }
        return run_study(config, _advance(progress, tasks))


def _advance(progress: Progress, tasks: dict[str, TaskID]) -> Callable[[str, float], None]:
    from rich.markup import escape

    def advance(label: str, fraction_done: float) -> None:
        task = tasks.get(label)
        if task is None:  # a label the study made up: give it a bar of its own
            task = tasks[label] = progress.add_task(escape(label), total=1.0)
        progress.update(task, completed=min(1.0, max(0.0, fraction_done)))

    return advance


def register(simulate_app: typer.Typer) -> None:
    """Add ``serving`` to the ``tessera simulate`` group."""
    simulate_app.command("serving")(simulate_serving)
