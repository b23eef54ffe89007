"""Speed of the serving twin: one policy replaying a whole request trace once.

Usage: ``python bench/serving_speed.py [--trace PATH] [--models 32] [--load 5] [--zipf 0.9] [--policy tessera]
[--gpus N] [--seed 0] [--synthetic] [--profile FILE]``

The trace defaults to the Azure LLM conversation trace beside the checkout
(``../shared/traces/azure-llm/AzureLLMInferenceTrace_conv.csv``); without it, or with ``--synthetic``, the seeded
synthetic Azure-like one. The workload is split into ``--models`` models exactly as ``tessera simulate serving``
splits it, and the engines run on the performance model the study would use (calibrated when its measurements are
beside the checkout). The issue's target: the whole one-hour conversation trace at load 5 with 32 models in at most
60 s on 2 cores.

Clusters: ``static`` runs on the replicas the study sizes for it (each model's own peak, found by replaying that
model alone several times): the sizing is timed apart and only the final replay is the measured one. Other policies
run on ``--gpus`` H100-80GB GPUs (nodes of 8); without it, on as many GPUs as one replica of every model needs, times
two (a cluster where autoscaling has room).

Prints the workload's size, the wall time of building it and of the replay, simulated requests per second, the
replay's headline figures, then one JSON line ``{"requests": int, "sim_wall_s": float, "requests_per_s": float}``.
``--profile FILE`` replays under cProfile instead, writes the stats to FILE and prints the top functions (cProfile
slows the replay down: its wall time is not the benchmark's).
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import time
from pathlib import Path

from tessera.serving.setups import SETUP_NAMES, serving_setup
from tessera.sim.serving.config import StudyConfig, parse_gpu_cluster
from tessera.sim.serving.perf_choice import describe, make_perf_factory
from tessera.sim.serving.result import PolicyRun
from tessera.sim.serving.study import DEFAULT_GPUS, nodes_for, run_study
from tessera.sim.serving.twin import Twin, TwinInputs
from tessera.sim.serving.workload import Workload, build_workload

DEFAULT_TRACE = Path(__file__).resolve().parents[1].parent / "shared/traces/azure-llm/AzureLLMInferenceTrace_conv.csv"


def default_gpus(workload: Workload) -> int:
    """Twice what one replica of every model takes: room to autoscale, and to place tensor-parallel gangs."""
    return 2 * sum(m.spec.tensor_parallel for m in workload.models)


def replay(config: StudyConfig, workload: Workload, policy: str, gpus: int | None, profile: Path | None) -> PolicyRun:
    if policy == "static":
        # The study sizes static per model, then replays once on those replicas: that replay is the one timed.
        started = time.perf_counter()
        static = StudyConfig(config.trace, config.models, config.zipf, config.load, ("static",), config.seeds)
        (run,) = run_study(static)
        print(f"static sizing and replay: {time.perf_counter() - started:.2f} s (the replay alone below)")
        return run
    kind = parse_gpu_cluster(DEFAULT_GPUS)
    count = gpus if gpus is not None else default_gpus(workload)
    nodes = nodes_for(count, kind)
    print(f"cluster: {len(nodes)} nodes, {sum(n.gpu_count for n in nodes)} x {kind.model.name}")
    inputs = TwinInputs(
        workload.requests, {m.name: m.spec for m in workload.models}, workload.duration_s, nodes, make_perf_factory()
    )
    twin = Twin(inputs, serving_setup(policy), config.seeds[0])
    if profile is None:
        return twin.run()
    profiler = cProfile.Profile()
    run = profiler.runcall(twin.run)
    profiler.dump_stats(str(profile))
    stats = pstats.Stats(str(profile))
    stats.sort_stats("tottime").print_stats(25)
    stats.sort_stats("cumulative").print_stats(30)
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", type=Path, default=None, help="an Azure-format LLM trace (default: conv, beside)")
    parser.add_argument("--synthetic", action="store_true", help="replay the seeded synthetic trace")
    parser.add_argument("--models", type=int, default=32)
    parser.add_argument("--load", type=float, default=5.0)
    parser.add_argument("--zipf", type=float, default=0.9)
    parser.add_argument("--policy", default="tessera", choices=SETUP_NAMES)
    parser.add_argument("--gpus", type=int, default=None, help="H100-80GB GPUs (not static)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--profile", type=Path, default=None, help="write cProfile stats of the replay here")
    args = parser.parse_args()
    trace = args.trace if args.trace is not None else (DEFAULT_TRACE if DEFAULT_TRACE.is_file() else None)
    if args.synthetic:
        trace = None
    config = StudyConfig(trace, args.models, args.zipf, args.load, (args.policy,), (args.seed,))

    started = time.perf_counter()
    arrays = config.load_trace()
    read_s = time.perf_counter() - started
    started = time.perf_counter()
    workload = build_workload(arrays, config.models, config.zipf, config.load, args.seed)
    build_s = time.perf_counter() - started
    requests = len(workload.requests)
    print(f"trace: {config.trace_name} ({len(arrays)} rows, read in {read_s:.2f} s); engines: {describe()}")
    print(
        f"workload: {requests} requests, {len(workload.models)} models, load {config.load:g}, zipf {config.zipf:g},"
        f" seed {args.seed}, {workload.duration_s:.0f} s; built in {build_s:.2f} s"
    )
    print(f"policy: {args.policy}; cpus available: {len(os.sched_getaffinity(0))}; load average: {os.getloadavg()}")

    run = replay(config, workload, args.policy, args.gpus, args.profile)
    rate = run.requests / run.sim_wall_s if run.sim_wall_s > 0 else float("inf")
    print(
        f"replay: {run.sim_wall_s:.2f} s wall, {rate:,.0f} simulated requests/s; {run.gpus} GPUs, "
        f"{run.gpu_hours:.1f} GPU-hours, peak {run.peak_gpus}, SLO attainment {run.slo_attainment_pct:.2f}% "
        f"(worst model {run.worst_model_slo_attainment_pct:.2f}%), dropped {run.dropped}, cold starts {run.cold_starts}"
    )
    print(json.dumps({"requests": run.requests, "sim_wall_s": round(run.sim_wall_s, 3), "requests_per_s": round(rate)}))


if __name__ == "__main__":
    main()
