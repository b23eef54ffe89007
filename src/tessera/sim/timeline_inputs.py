"""Workloads for the timeline simulator, built from the command line's options.

- ``openb``: the openb pod list with its real timestamps on ``gpu_scale`` of the node list's GPUs (default 0.005, a
  scale at which static binding queues on the default trace), or the embedded synthetic stand-in (default
  scale 0.15) when no files are given;
- ``training``: 1,000 Gavel-style jobs with Philly runtimes on 16 nodes of a heterogeneous PAI-shaped cluster at an
  offered load of 1.5 (enough that jobs queue); with ``traces`` (a folder holding ``gavel/``, ``philly/`` and
  ``pai/``) the real tables are read by path, otherwise the embedded ones.

Called by ``tessera simulate timeline``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tessera.core.cluster import NodeSpec
from tessera.core.errors import InvalidRequestError
from tessera.core.throughput import ThroughputModel
from tessera.sim.gavel import default_models, load_gavel_models
from tessera.sim.jobs import TimelineJob
from tessera.sim.philly import philly_runtime_sampler
from tessera.sim.traces import check_pods_fit, load_nodes, load_pods, trace_name
from tessera.sim.workloads import openb_timeline, synthetic_openb_timeline, training_workload

TIMELINE_WORKLOADS = ("openb", "training")
DEFAULT_OPENB_SCALE = 0.005
DEFAULT_SYNTHETIC_SCALE = 0.15
TRAINING_JOBS = 1000
TRAINING_NODES = 16
TRAINING_OFFERED_LOAD = 1.5


@dataclass(frozen=True, slots=True)
class TimelineInputs:
    workload: str  # name shown in reports
    nodes: list[NodeSpec]
    jobs: list[TimelineJob]
    throughput: ThroughputModel


def timeline_inputs(
    workload: str,
    nodes_path: Path | None,
    pods_path: Path | None,
    gpu_scale: float | None,
    seed: int,
    traces: Path | None = None,
) -> TimelineInputs:
    if workload not in TIMELINE_WORKLOADS:
        raise InvalidRequestError(
            "--workload", f"unknown workload {workload!r} (known: {', '.join(TIMELINE_WORKLOADS)})"
        )
    if gpu_scale is not None and not 0 < gpu_scale <= 1:
        raise InvalidRequestError("--gpu-scale", f"must be in (0, 1], got {gpu_scale}")
    if workload == "openb":
        return _openb(nodes_path, pods_path, gpu_scale, seed)
    throughput, _ = load_gavel_models(traces / "gavel" if traces else None)
    sampler = philly_runtime_sampler(traces / "philly" / "philly_runtime.csv" if traces else None, seed)
    pai = traces / "pai" / "pai_machine_spec.csv" if traces else None
    nodes, jobs = training_workload(
        seed,
        TRAINING_JOBS,
        throughput_model=throughput,
        runtime_sampler=sampler,
        pai_path=pai,
        pai_max_nodes=TRAINING_NODES,
        offered_load=TRAINING_OFFERED_LOAD,
    )
    return TimelineInputs("training", nodes, jobs, throughput)


def _openb(nodes_path: Path | None, pods_path: Path | None, gpu_scale: float | None, seed: int) -> TimelineInputs:
    throughput = default_models()[0]
    if nodes_path is None and pods_path is None:
        nodes, jobs = synthetic_openb_timeline(seed, gpu_scale or DEFAULT_SYNTHETIC_SCALE)
        return TimelineInputs("openb (synthetic stand-in)", nodes, jobs, throughput)
    if nodes_path is None or pods_path is None:
        missing = "--nodes" if nodes_path is None else "--pods"
        raise InvalidRequestError(missing, "give both --nodes and --pods, or neither")
    all_nodes, pods = load_nodes(nodes_path), load_pods(pods_path)
    check_pods_fit(pods, all_nodes, pods_path)
    nodes, jobs = openb_timeline(pods, all_nodes, gpu_scale or DEFAULT_OPENB_SCALE)
    return TimelineInputs(f"openb ({trace_name(pods_path)})", nodes, jobs, throughput)
