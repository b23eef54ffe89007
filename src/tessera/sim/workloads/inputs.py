"""Workloads for the timeline simulator, built from the command line's options.

- ``openb``: the openb pod list with its real timestamps on ``gpu_scale`` of the node list's GPUs (default 0.005, a
  scale at which static binding queues on the default trace), or the embedded synthetic stand-in (default
  scale 0.15) when no files are given;
- ``training``: 1,000 Gavel-style jobs with Philly runtimes on 16 nodes of a heterogeneous PAI-shaped cluster at an
  offered load of 1.5 (enough that jobs queue); with ``traces`` (a folder holding ``gavel/``, ``philly/`` and
  ``pai/``) the real tables are read by path, otherwise the embedded ones;
- ``tenants``: three queues with quotas in one cohort and bursty, contending demand over one day
  (``tessera.sim.workloads.tenants``); ``TimelineInputs.queues`` holds their ``QueueSpec`` (``tenant_queue_specs``).
  Queues and jobs may come from JSON files instead (``--queues``, ``--jobs``; ``tessera.sim.workloads.files``).

Called by ``tessera simulate timeline``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tessera.core.cluster import NodeSpec
from tessera.core.errors import InputFileError, InvalidRequestError
from tessera.core.queueing import QueueSpec, ResourceVector
from tessera.core.throughput import ColocationModel, ThroughputModel
from tessera.sim.traces.openb import load_trace_files
from tessera.sim.workloads.files import check_gangs_fit, load_jobs, load_queues
from tessera.sim.workloads.gavel import default_models, load_gavel_models
from tessera.sim.workloads.jobs import TimelineJob
from tessera.sim.workloads.openb import openb_timeline, synthetic_openb_timeline
from tessera.sim.workloads.philly import philly_runtime_sampler
from tessera.sim.workloads.tenants import TenantQueue, tenants_workload
from tessera.sim.workloads.training import training_workload

TIMELINE_WORKLOADS = ("openb", "training", "tenants")
TENANTS_HORIZON_S = 86_400.0
DEFAULT_OPENB_SCALE = 0.005
DEFAULT_SYNTHETIC_SCALE = 0.15
TRAINING_JOBS = 1000
TRAINING_NODES = 16
TRAINING_OFFERED_LOAD = 1.5
TRAINING_SHARING_SHARE = 0.3  # single-worker rigid jobs that ask for half a GPU (training_workload)


@dataclass(frozen=True, slots=True)
class TimelineInputs:
    workload: str  # name shown in reports
    nodes: list[NodeSpec]
    jobs: list[TimelineJob]
    throughput: ThroughputModel
    queues: tuple[QueueSpec, ...] = ()  # tenant queues with quotas (tenants); empty = no quotas
    colocation: ColocationModel | None = None  # slowdown of training jobs sharing a GPU (training); None = none


def timeline_inputs(
    workload: str,
    nodes_path: Path | None,
    pods_path: Path | None,
    gpu_scale: float | None,
    seed: int,
    traces: Path | None = None,
    queues_path: Path | None = None,
    jobs_path: Path | None = None,
) -> TimelineInputs:
    """The workload's cluster, jobs, throughput model and queues. ``queues_path`` / ``jobs_path`` (tenants only)
    replace the built-in queues / jobs with those of JSON files (``tessera.sim.workloads.files``)."""
    if workload not in TIMELINE_WORKLOADS:
        raise InvalidRequestError(
            "--workload", f"unknown workload {workload!r} (known: {', '.join(TIMELINE_WORKLOADS)})"
        )
    if gpu_scale is not None and not 0 < gpu_scale <= 1:
        raise InvalidRequestError("--gpu-scale", f"must be in (0, 1], got {gpu_scale}")
    if workload != "tenants" and (queues_path or jobs_path):
        raise InvalidRequestError("--queues" if queues_path else "--jobs", "only with --workload tenants")
    if workload == "openb":
        return _openb(nodes_path, pods_path, gpu_scale, seed)
    if workload == "tenants":
        return _tenants(seed, queues_path, jobs_path)
    throughput, colocation = load_gavel_models(traces / "gavel" if traces else None)
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
        sharing_share=TRAINING_SHARING_SHARE,
    )
    return TimelineInputs("training", nodes, jobs, throughput, colocation=colocation)


def _tenants(seed: int, queues_path: Path | None, jobs_path: Path | None) -> TimelineInputs:
    nodes, jobs, queues = tenants_workload(seed, TENANTS_HORIZON_S)
    if queues_path is not None:
        queues = load_queues(queues_path)
    if jobs_path is not None:
        jobs = load_jobs(jobs_path)
        check_gangs_fit(jobs, nodes, str(jobs_path))
        names = {q.name for q in queues}
        for job in jobs:
            if job.queue not in names:
                raise InputFileError(str(jobs_path), None, "queue", f"job {job.id}: unknown queue {job.queue!r}")
    return TimelineInputs("tenants", nodes, jobs, default_models()[0], tenant_queue_specs(queues, nodes))


def _openb(nodes_path: Path | None, pods_path: Path | None, gpu_scale: float | None, seed: int) -> TimelineInputs:
    throughput = default_models()[0]
    loaded = load_trace_files(nodes_path, pods_path)
    if loaded is None:
        nodes, jobs = synthetic_openb_timeline(seed, gpu_scale or DEFAULT_SYNTHETIC_SCALE)
        return TimelineInputs("openb (synthetic stand-in)", nodes, jobs, throughput)
    name, all_nodes, pods = loaded
    nodes, jobs = openb_timeline(pods, all_nodes, gpu_scale or DEFAULT_OPENB_SCALE)
    return TimelineInputs(f"openb ({name})", nodes, jobs, throughput)


def tenant_queue_specs(queues: list[TenantQueue], nodes: list[NodeSpec]) -> tuple[QueueSpec, ...]:
    """The tenants' queues as the scheduler's ``QueueSpec``: GPU amounts as given; CPU and memory in proportion to
    the queue's GPU share of the cluster (so that GPUs, not host resources, bound what a queue may run)."""
    total_gpu_milli = max(sum(n.gpu_count for n in nodes) * 1000, 1)
    cpu_milli = sum(n.cpu_milli for n in nodes)
    mem_mib = sum(n.mem_mib for n in nodes)

    def vector(gpu_milli: int) -> ResourceVector:
        share = gpu_milli / total_gpu_milli
        return ResourceVector(gpu_milli, int(cpu_milli * share), int(mem_mib * share))

    def limit(gpu_milli: int | None, flavors: list[str]) -> dict[str, ResourceVector] | None:
        return None if gpu_milli is None else {flavor: vector(gpu_milli) for flavor in flavors}

    specs = []
    for q in queues:
        flavors = list(q.nominal_gpu_milli)
        specs.append(
            QueueSpec(
                q.name,
                q.cohort,
                {flavor: vector(milli) for flavor, milli in q.nominal_gpu_milli.items()},
                limit(q.borrowing_limit_gpu_milli, flavors),
                limit(q.lending_limit_gpu_milli, flavors),
                q.weight,
            )
        )
    return tuple(specs)
