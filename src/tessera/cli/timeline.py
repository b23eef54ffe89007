"""``tessera simulate timeline``: replay a workload over time (arrivals, queueing, departures) under scheduling
policies, with the placement each preset runs or the one ``--placement`` names (as ``tessera up --placement``), and
write the report (JCT, waiting, GPU allocation per policy). Registered on ``tessera simulate`` by
``tessera.cli.main``; the simulator loads only when the command runs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tessera.cli.options import NodesOption, PodsOption, finite_float
from tessera.cli.terminal import one_line_errors


def simulate_timeline(
    out: Annotated[Path, typer.Option("--out", help="Folder for summary.json, summary.md and the plots.")],
    workload: Annotated[str, typer.Option("--workload", help="openb, training or tenants.")] = "openb",
    nodes: NodesOption = None,
    pods: PodsOption = None,
    gpu_scale: Annotated[
        float | None,
        typer.Option("--gpu-scale", parser=finite_float, help="Share of the node list's GPUs to keep (openb)."),
    ] = None,
    policies: Annotated[
        str | None,
        typer.Option(
            "--policies", help="Comma-separated timeline policies (default: every preset).", show_default=False
        ),
    ] = None,
    seeds: Annotated[str, typer.Option("--seeds", help="Seeds of the generated workloads.")] = "0",
    placement: Annotated[
        str | None,
        typer.Option("--placement", help="Placement policy instead of each policy's own (as tessera up --placement)."),
    ] = None,
    knobs: Annotated[
        list[str] | None,
        typer.Option("--set", help="A preset knob, KEY=VALUE (repeat), as tessera up --set: e.g. elastic=false."),
    ] = None,
    traces: Annotated[
        Path | None, typer.Option("--traces", help="Folder with gavel/, philly/, pai/ for the training workload.")
    ] = None,
    queues: Annotated[
        Path | None, typer.Option("--queues", help="JSON file of queues with quotas (tenants; replaces the built-in).")
    ] = None,
    jobs_file: Annotated[
        Path | None, typer.Option("--jobs", help="JSON file of jobs (tenants; replaces the built-in demand).")
    ] = None,
) -> None:
    """Replay a workload over time: arrivals, queueing, departures; JCT, waiting and GPU allocation per policy."""
    from rich.console import Console
    from rich.markup import escape

    from tessera.cli.sim_tables import queue_table, timeline_table
    from tessera.core.placement import PLACEMENTS
    from tessera.core.preset_knobs import parse_knobs
    from tessera.core.presets import PRESETS, resolve_preset
    from tessera.errors import InvalidRequestError
    from tessera.sim.placement_study.sweep import parse_seeds
    from tessera.sim.replay.timeline import run_timeline
    from tessera.sim.reports.placement_study import format_seeds
    from tessera.sim.reports.timeline import summarize as summarize_timeline
    from tessera.sim.reports.timeline import write_timeline_report
    from tessera.sim.workloads.inputs import timeline_inputs

    with one_line_errors():
        chosen = policies if policies is not None else ",".join(PRESETS)
        names = [resolve_preset(n.strip(), "--policies").name for n in chosen.split(",") if n.strip()]
        if placement is not None and placement not in PLACEMENTS:
            raise InvalidRequestError(
                "--placement", f"unknown placement {placement!r} (known: {', '.join(PLACEMENTS)})"
            )
        settings = tuple(knobs or ())
        parse_knobs(settings)  # fail early on a bad knob
        seed_list = parse_seeds(seeds)
        console = Console()
        results = []
        workload_name = workload
        for seed in seed_list:
            inputs = timeline_inputs(workload, nodes, pods, gpu_scale, seed, traces, queues, jobs_file)
            workload_name = inputs.workload
            gpus = sum(n.gpu_count for n in inputs.nodes)
            console.print(
                f"[bold]{escape(inputs.workload)}[/] seed {seed}: {len(inputs.nodes)} nodes, {gpus} GPUs, "
                f"{len(inputs.jobs):,} jobs"
            )
            for name in names:
                result = run_timeline(
                    inputs.nodes,
                    inputs.jobs,
                    name,
                    seed,
                    inputs.throughput,
                    inputs.queues,
                    colocation=inputs.colocation,
                    placement=placement,
                    knobs=settings,
                )
                console.print(f"  {result.policy}: {result.wall_s:.1f} s")
                results.append(result)
        paths = write_timeline_report(out, workload_name, results)
        summaries = summarize_timeline(results)
        console.print(timeline_table(workload_name, format_seeds(seed_list), summaries))
        if (queues_of := queue_table(summaries)) is not None:
            console.print(queues_of)
        console.print("Report written to:", *[str(p) for p in paths], sep="\n  ", markup=False, highlight=False)


def register(simulate_app: typer.Typer) -> None:
    """Add ``timeline`` to the ``tessera simulate`` group."""
    simulate_app.command("timeline")(simulate_timeline)
