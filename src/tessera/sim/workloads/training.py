"""The ``training`` timeline workload: Gavel-style training jobs with Philly runtimes on a heterogeneous cluster.

``tessera.sim.workloads.inputs`` (``tessera simulate timeline --workload training``) and the benchmarks call
``training_workload``: job types, scale factors and work in steps as in Gavel's generator, an isolated runtime on
the reference GPU that follows Philly's runtimes (``tessera.sim.workloads.philly``), on a (by default PAI-shaped,
``tessera.sim.workloads.clusters``) cluster. The files it may read (``../shared/traces/...``) are given by path;
without them it uses the embedded defaults. Deterministic for a seed (NumPy ``default_rng``); the jobs are sorted
by (arrival, id).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Literal

import numpy as np
import numpy.typing as npt

from tessera.core.cluster import NodeSpec
from tessera.core.errors import InvalidRequestError
from tessera.core.throughput import ThroughputModel
from tessera.core.workload import MILLI_PER_GPU
from tessera.sim.workloads.clusters import pai_cluster
from tessera.sim.workloads.gavel import default_models
from tessera.sim.workloads.jobs import TimelineJob, elastic_range, scale_factors, training_worker
from tessera.sim.workloads.philly import RuntimeSampler, philly_runtime_sampler

FloatArray = npt.NDArray[np.float64]


def training_workload(
    seed: int = 0,
    num_jobs: int = 500,
    cluster: Literal["pai"] | Sequence[NodeSpec] = "pai",
    throughput_model: ThroughputModel | None = None,
    runtime_sampler: RuntimeSampler | None = None,
    *,
    offered_load: float = 1.0,
    arrival_rate_per_s: float | None = None,
    pai_path: str | Path | None = None,
    pai_max_nodes: int = 64,
    elastic_share: float = 0.2,
    checkpointed_share: float = 0.8,
    sharing_share: float = 0.0,
) -> tuple[list[NodeSpec], list[TimelineJob]]:
    """``num_jobs`` Gavel-style training jobs with Philly runtimes, Poisson arrivals, on a heterogeneous cluster.

    Distributions (all drawn from ``default_rng(seed)``, in this order):

    - job type: uniform over ``throughput_model.job_types`` (default: ``tessera.sim.workloads.gavel.default_models()``);
    - scale factor (GPUs, as a gang of 1-GPU workers of 4 cores and 16 GiB each): 1/2/4/8 with probability
      0.70/0.10/0.15/0.05 (Gavel's generator), capped at the largest power of two within the cluster's GPUs;
    - reference runtime: ``runtime_sampler`` (default: the embedded Philly lognormal fit, clipped to
      [60 s, 7 days]); ``work_steps`` = runtime × throughput of the job type on the model's reference GPU, so
      that the job alone on reference GPUs runs exactly that long and ``work / throughput`` elsewhere;
    - elastic: with probability ``elastic_share``, ``elastic_min`` = max(1, gang // 2), ``elastic_max`` = 2 × gang;
    - checkpointed: with probability ``checkpointed_share``; every job is preemptible, priority class training;
    - sharing: with probability ``sharing_share`` a single-worker, non-elastic job asks for
      ``SHARED_TRAINING_MILLI`` of one GPU instead of a whole one (it fits beside another job; how fast either then
      runs is the co-location model's business), drawn from a second generator seeded ``(seed, 1)`` so that the
      draws above do not depend on it;
    - arrivals: a Poisson process (exponential gaps, first job at 0) of rate ``arrival_rate_per_s``, or, when that
      is None, the rate at which the offered GPU-time (GPUs × runtime on a GPU-count-weighted average GPU of the
      cluster) equals ``offered_load`` × the cluster's GPUs.

    ``cluster`` is a node list or ``"pai"``: ``pai_cluster(pai_path, pai_max_nodes)`` (the PAI machine list, or
    its embedded mix when ``pai_path`` is None). Returns the cluster and the jobs.
    """
    if num_jobs < 1:
        raise InvalidRequestError("num_jobs", f"must be >= 1, got {num_jobs}")
    shares = (("elastic_share", elastic_share), ("checkpointed_share", checkpointed_share))
    for name, share in (*shares, ("sharing_share", sharing_share)):
        if not 0.0 <= share <= 1.0:
            raise InvalidRequestError(name, f"must be in [0, 1], got {share}")
    if isinstance(cluster, str) and cluster != "pai":
        raise InvalidRequestError("cluster", f"unknown cluster {cluster!r} (give 'pai' or a node list)")
    nodes = pai_cluster(pai_path, pai_max_nodes) if isinstance(cluster, str) else list(cluster)
    total_gpus = sum(node.gpu_count for node in nodes)
    if total_gpus == 0:
        raise InvalidRequestError("cluster", "the training workload needs a cluster with GPUs")
    model = throughput_model if throughput_model is not None else default_models()[0]
    sampler = runtime_sampler if runtime_sampler is not None else philly_runtime_sampler(None, seed)
    rng = np.random.default_rng(seed)
    job_types = list(model.job_types) or ["generic"]
    types = [job_types[int(i)] for i in rng.integers(len(job_types), size=num_jobs)]
    gangs = scale_factors(rng, num_jobs, total_gpus)
    runtime_s = sampler.draw(rng, num_jobs)
    elastic = rng.random(num_jobs) < elastic_share
    checkpointed = rng.random(num_jobs) < checkpointed_share
    sharing = (np.random.default_rng([seed, 1]).random(num_jobs) < sharing_share) & (gangs == 1) & ~elastic
    gpus_each = np.where(sharing, SHARED_TRAINING_MILLI / MILLI_PER_GPU, 1.0)
    rate = arrival_rate_per_s
    if rate is None:
        gpu_seconds = gpus_each * gangs * runtime_s * _slowdowns(model, types, nodes)
        rate = _rate_for_load(offered_load, total_gpus, gpu_seconds)
    if not rate > 0:
        raise InvalidRequestError("arrival_rate_per_s", f"must be > 0, got {rate}")
    gaps = rng.exponential(1.0 / rate, size=num_jobs)
    arrival_s = np.cumsum(gaps) - gaps[0]
    worker = training_worker("default")
    shared_worker = replace(worker, gpu_milli=SHARED_TRAINING_MILLI)
    jobs: list[TimelineJob] = []
    for i, job_type in enumerate(types):
        work_steps = float(runtime_s[i]) * model.reference_steps_per_s(job_type)
        gang = int(gangs[i])
        low, high = elastic_range(gang, bool(elastic[i]))
        job = TimelineJob(
            id=f"train-{i:05d}",
            arrival_s=float(arrival_s[i]),
            request=shared_worker if sharing[i] else worker,
            duration_s=None,
            job_type=job_type,
            work_steps=work_steps,
            queue=worker.queue,
            priority=worker.priority,
            preemptible=True,
            gang=gang,
            elastic_min=low,
            elastic_max=high,
            checkpointed=bool(checkpointed[i]),
        )
        jobs.append(job)
    return nodes, sorted(jobs, key=lambda job: (job.arrival_s, job.id))


SHARED_TRAINING_MILLI = 500  # what a sharing training job asks of its GPU


def _slowdowns(model: ThroughputModel, types: Sequence[str], nodes: Sequence[NodeSpec]) -> FloatArray:
    """Per job: reference throughput ÷ throughput on the cluster's GPUs, averaged weighted by GPU count."""
    gpus: dict[str, int] = {}
    for node in nodes:
        if node.gpu_model and node.gpu_count > 0:
            gpus[node.gpu_model] = gpus.get(node.gpu_model, 0) + node.gpu_count
    total = sum(gpus.values())
    factor: dict[str, float] = {}
    for job_type in set(types):
        reference = model.reference_steps_per_s(job_type)
        factor[job_type] = sum(n * reference / model.throughput(job_type, m) for m, n in gpus.items()) / total
    return np.array([factor[t] for t in types], dtype=np.float64)


def _rate_for_load(offered_load: float, total_gpus: int, gpu_seconds: FloatArray) -> float:
    if not offered_load > 0:
        raise InvalidRequestError("offered_load", f"must be > 0, got {offered_load}")
    return offered_load * total_gpus / float(gpu_seconds.mean())
