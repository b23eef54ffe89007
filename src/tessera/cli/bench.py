"""``tessera bench``: the speed of scheduling code (``tessera bench placement``). Loaded when ``bench`` is named."""

from __future__ import annotations

from typing import Annotated

import typer

from tessera.cli.main import InflateOption
from tessera.cli.options import NodesOption, PodsOption
from tessera.cli.terminal import one_line_errors
from tessera.core.errors import InvalidRequestError

bench_app = typer.Typer(help="Measure the speed of scheduling code.", no_args_is_help=True)


@bench_app.command("placement")
def bench_placement(
    policy: Annotated[
        str,
        typer.Option(
            "--policy",
            "--policies",
            help="Placement policy to measure, or several (tessera,fgd): they then run in lockstep in this process.",
        ),
    ],
    nodes: NodesOption = None,
    pods: PodsOption = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the node order and the arrival sequence.")] = 42,
    inflate: InflateOption = 1.3,
    baseline: Annotated[
        str | None,
        typer.Option("--baseline", help="With several policies: the one the others' pods/s are divided by (last)."),
    ] = None,
) -> None:
    """Placement speed on the inflated arrival sequence, printed as one JSON line per policy.

    One policy: pods/s and the p99 decision time. Several: the policies take turns arrival by arrival (lockstep),
    and each line adds the p50 decision time, the time to build the policy (setup_ms, not counted as decision
    time) and pods/s over the baseline's."""
    import json

    from tessera.sim.placement_study.benchmark import compare_placement, measure_placement
    from tessera.sim.placement_study.inputs import load_inputs
    from tessera.sim.placement_study.sweep import check_inflate, parse_policies

    with one_line_errors():
        names = parse_policies(policy, "--policy")
        if baseline is not None and baseline.strip().lower() not in names:
            raise InvalidRequestError("--baseline", f"{baseline!r} is not one of the policies measured ({policy})")
        check_inflate(inflate)
        inputs = load_inputs(nodes, pods)
        if len(names) == 1:
            typer.echo(json.dumps(measure_placement(inputs, names[0], seed, inflate)))
            return
        base = baseline.strip().lower() if baseline is not None else None
        for line in compare_placement(inputs, names, seed, inflate, base):
            typer.echo(json.dumps(line))
