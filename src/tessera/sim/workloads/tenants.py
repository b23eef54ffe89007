"""The ``tenants`` timeline workload: three teams with quotas in one cohort and bursty, contending demand.

``tessera.sim.workloads.inputs`` (``tessera simulate timeline --workload tenants``) and the benchmarks call
``tenants_workload``, and the queueing layer builds its queue specs from ``TenantQueue.as_dict()``. Everything is
drawn from ``default_rng(seed)``.

Cluster (``tenants_cluster``): 6 nodes of 8 × A100-80GB (128 cores, 1 TiB) and 6 of 8 × V100M32 (96 cores,
768 GiB): 96 GPUs. Quotas are on the ``"*"`` flavor (any GPU type) and add up to the cluster:

=======  =======  ==============  ===========  ======  ===================================
queue    nominal  borrowing lim.  lending lim  weight  demand
=======  =======  ==============  ===========  ======  ===================================
team-a   40 GPUs  24 GPUs         32 GPUs      1       4 inference services + training
team-b   32 GPUs  32 GPUs         all          1       2 inference services + training
team-c   24 GPUs  48 GPUs         all          1       training only
=======  =======  ==============  ===========  ======  ===================================

Demand per queue (all in cohort ``org``):

- inference services (priority class inference-critical, not preemptible): arrive in the first minute and run to
  the horizon; team-a's are 2 whole GPUs and 2 half GPUs, team-b's 2 half GPUs;
- training (priority class training, preemptible; 80% checkpointed; 20% elastic with min = max(1, gang // 2) and
  max = 2 × gang): alternating on/off phases with exponential lengths (means ``mean_on_s`` = ``mean_off_s`` = 4 h;
  team-a and team-c start on, team-b starts off). In an on phase jobs arrive as a Poisson process whose offered
  GPU demand is ``burst_load`` (1.5) × the queue's nominal quota; in an off phase at 5% of that rate. Gang sizes
  1/2/4/8 GPUs with Gavel's probabilities (0.70/0.10/0.15/0.05), 1-GPU workers; runtime lognormal, median 30 min,
  sigma 1.0, clipped to [5 min, 6 h]; job type uniform over the embedded Gavel-style types;
- best-effort (priority class best-effort, preemptible, not checkpointed): a steady Poisson stream of 4 per hour
  per queue of single fractional GPUs (250 or 500 milli), runtime lognormal, median 20 min, sigma 0.8.

Arrivals fall in [0, ``horizon_s``); jobs may run past it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from tessera.core.cluster import NodeSpec
from tessera.core.errors import InvalidRequestError
from tessera.core.workload import MILLI_PER_GPU, Request
from tessera.sim.workloads.gavel import DEFAULT_ISOLATED_STEPS_PER_S
from tessera.sim.workloads.jobs import (
    PRIORITY_BEST_EFFORT,
    PRIORITY_INFERENCE,
    SCALE_FACTORS,
    TimelineJob,
    elastic_range,
    scale_factors,
    training_worker,
)

MIB_PER_GIB = 1024
ANY_FLAVOR = "*"
COHORT = "org"

TRAINING_MEDIAN_S = 1800.0
TRAINING_LOG_SIGMA = 1.0
TRAINING_MIN_S = 300.0
TRAINING_MAX_S = 6 * 3600.0
OFF_RATE_SHARE = 0.05  # off-phase arrival rate as a share of the on-phase rate
BEST_EFFORT_PER_HOUR = 4.0
BEST_EFFORT_MILLI = (250, 500)
BEST_EFFORT_MEDIAN_S = 1200.0
BEST_EFFORT_LOG_SIGMA = 0.8
SERVICE_CPU_MILLI = 8000
SERVICE_MEM_MIB = 32 * MIB_PER_GIB


@dataclass(frozen=True)
class TenantQueue:
    """A tenant's queue spec as plain data (the queueing layer turns it into its own QueueSpec)."""

    name: str
    cohort: str | None  # queues of one cohort lend and borrow among themselves; None = alone
    nominal_gpu_milli: Mapping[str, int]  # guaranteed GPU milli per flavor (GPU model; "*" = any type)
    borrowing_limit_gpu_milli: int | None = None  # most it may use above nominal; None = no limit (needs a cohort)
    lending_limit_gpu_milli: int | None = None  # most of its unused nominal others may borrow; None = all
    weight: float = 1.0  # fair-share weight when idle capacity is divided; > 0

    def __post_init__(self) -> None:
        if not self.name:
            raise InvalidRequestError("name", "a queue needs a name")
        for flavor, milli in self.nominal_gpu_milli.items():
            if milli < 0:
                raise InvalidRequestError("nominal_gpu_milli", f"queue {self.name}: {flavor} quota {milli} < 0")
        for name in ("borrowing_limit_gpu_milli", "lending_limit_gpu_milli"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise InvalidRequestError(name, f"queue {self.name}: must be >= 0, got {value}")
        if self.cohort is None and self.borrowing_limit_gpu_milli:
            raise InvalidRequestError("borrowing_limit_gpu_milli", f"queue {self.name}: borrowing needs a cohort")
        lending = self.lending_limit_gpu_milli
        if lending is not None and lending > self.total_nominal_gpu_milli:
            raise InvalidRequestError("lending_limit_gpu_milli", f"queue {self.name}: above its nominal quota")
        if not (math.isfinite(self.weight) and self.weight > 0):
            raise InvalidRequestError("weight", f"queue {self.name}: must be a finite number > 0")

    @property
    def total_nominal_gpu_milli(self) -> int:
        return sum(self.nominal_gpu_milli.values())

    def as_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "cohort": self.cohort,
            "nominal_gpu_milli": dict(self.nominal_gpu_milli),
            "borrowing_limit_gpu_milli": self.borrowing_limit_gpu_milli,
            "lending_limit_gpu_milli": self.lending_limit_gpu_milli,
            "weight": self.weight,
        }


@dataclass(frozen=True)
class _Tenant:
    queue: TenantQueue
    services_milli: tuple[int, ...]  # one inference service per entry: its GPU share (1000 = a whole GPU)
    starts_on: bool  # whether the first training phase is an on (burst) phase


def _gpus(count: int) -> int:
    return count * MILLI_PER_GPU


def tenant_queues() -> list[TenantQueue]:
    """The three queues of the ``tenants`` workload (see the module docstring)."""
    return [t.queue for t in _tenants()]


def _tenants() -> list[_Tenant]:
    return [
        _Tenant(
            TenantQueue("team-a", COHORT, {ANY_FLAVOR: _gpus(40)}, _gpus(24), _gpus(32)),
            (1000, 1000, 500, 500),
            starts_on=True,
        ),
        _Tenant(TenantQueue("team-b", COHORT, {ANY_FLAVOR: _gpus(32)}, _gpus(32), None), (500, 500), starts_on=False),
        _Tenant(TenantQueue("team-c", COHORT, {ANY_FLAVOR: _gpus(24)}, _gpus(48), None), (), starts_on=True),
    ]


def tenants_cluster() -> list[NodeSpec]:
    """6 × (8 × A100-80GB) and 6 × (8 × V100M32) nodes: 96 GPUs, the sum of the queues' nominal quotas."""
    a100 = [NodeSpec(f"ten-a100-{i}", 128_000, 1024 * MIB_PER_GIB, 8, "A100-80GB") for i in range(6)]
    v100 = [NodeSpec(f"ten-v100-{i}", 96_000, 768 * MIB_PER_GIB, 8, "V100M32") for i in range(6)]
    return a100 + v100


def tenants_workload(
    seed: int = 0,
    horizon_s: float = 86_400.0,
    *,
    mean_on_s: float = 4 * 3600.0,
    mean_off_s: float = 4 * 3600.0,
    burst_load: float = 1.5,
) -> tuple[list[NodeSpec], list[TimelineJob], list[TenantQueue]]:
    """The cluster, the jobs (sorted by arrival, id) and the queue specs of the ``tenants`` workload.

    Distributions (the module docstring has the full table): per queue, inference services that run from the first
    minute to ``horizon_s``; training jobs in alternating on/off phases (exponential lengths, means ``mean_on_s`` and
    ``mean_off_s``) arriving as a Poisson process whose on-phase GPU demand is ``burst_load`` × the queue's nominal
    quota (5% of that rate when off), gangs of 1/2/4/8 GPUs (0.70/0.10/0.15/0.05), lognormal runtimes (median
    30 min, sigma 1.0, clipped to [5 min, 6 h]); a steady Poisson stream of 4 best-effort fractional jobs per hour
    (250 or 500 milli, lognormal runtime with median 20 min, sigma 0.8).
    """
    for name, value in (
        ("horizon_s", horizon_s),
        ("mean_on_s", mean_on_s),
        ("mean_off_s", mean_off_s),
        ("burst_load", burst_load),
    ):
        if not (math.isfinite(value) and value > 0):
            raise InvalidRequestError(name, f"must be a finite number > 0, got {value}")
    rng = np.random.default_rng(seed)
    nodes = tenants_cluster()
    total_gpus = sum(node.gpu_count for node in nodes)
    jobs: list[TimelineJob] = []
    for tenant in _tenants():
        queue = tenant.queue.name
        jobs.extend(_services(rng, tenant, horizon_s))
        phases = _phases(rng, horizon_s, mean_on_s, mean_off_s, tenant.starts_on)
        on_rate = burst_load * tenant.queue.total_nominal_gpu_milli / MILLI_PER_GPU / _mean_training_gpu_s()
        pieces = [(t0, t1, on_rate if on else on_rate * OFF_RATE_SHARE) for t0, t1, on in phases]
        times = _piecewise_poisson(rng, pieces)
        jobs.extend(_training_jobs(rng, queue, times, total_gpus))
        best_effort_rate = BEST_EFFORT_PER_HOUR / 3600.0
        jobs.extend(_best_effort_jobs(rng, queue, _piecewise_poisson(rng, [(0.0, horizon_s, best_effort_rate)])))
    jobs.sort(key=lambda job: (job.arrival_s, job.id))
    return nodes, jobs, [t.queue for t in _tenants()]


def _mean_training_gpu_s() -> float:
    """Expected GPU-seconds of one training job (gang mean × lognormal mean, clipping ignored)."""
    mean_gang = sum(size * p for size, p in SCALE_FACTORS)
    return mean_gang * TRAINING_MEDIAN_S * math.exp(TRAINING_LOG_SIGMA**2 / 2)


def _phases(
    rng: np.random.Generator, horizon_s: float, mean_on_s: float, mean_off_s: float, starts_on: bool
) -> list[tuple[float, float, bool]]:
    """Alternating (start, end, on) phases covering [0, horizon_s), exponential lengths."""
    phases: list[tuple[float, float, bool]] = []
    start, on = 0.0, starts_on
    while start < horizon_s:
        end = min(horizon_s, start + float(rng.exponential(mean_on_s if on else mean_off_s)))
        phases.append((start, end, on))
        start, on = end, not on
    return phases


def _piecewise_poisson(rng: np.random.Generator, pieces: list[tuple[float, float, float]]) -> list[float]:
    """Arrival times of a Poisson process with rate ``rate`` per second on each (start, end, rate) piece."""
    times: list[float] = []
    for start, end, rate in pieces:
        count = int(rng.poisson(rate * (end - start)))
        times.extend(sorted(float(t) for t in rng.uniform(start, end, size=count)))
    return times


def _services(rng: np.random.Generator, tenant: _Tenant, horizon_s: float) -> list[TimelineJob]:
    jobs: list[TimelineJob] = []
    for k, milli in enumerate(tenant.services_milli):
        request = Request(
            num_gpus=1,
            gpu_milli=milli,
            cpu_milli=SERVICE_CPU_MILLI,
            mem_mib=SERVICE_MEM_MIB,
            priority=PRIORITY_INFERENCE,
            queue=tenant.queue.name,
        )
        arrival_s = float(rng.uniform(0.0, min(60.0, horizon_s)))
        jobs.append(
            TimelineJob(
                f"{tenant.queue.name}-svc-{k}",
                arrival_s,
                request,
                horizon_s - arrival_s,
                job_type="inference",
                queue=request.queue,
                priority=request.priority,
            )
        )
    return jobs


def _training_jobs(rng: np.random.Generator, queue: str, times: list[float], total_gpus: int) -> list[TimelineJob]:
    count = len(times)
    job_types = sorted(DEFAULT_ISOLATED_STEPS_PER_S)
    types = rng.integers(len(job_types), size=count)
    gangs = scale_factors(rng, count, total_gpus)
    runtime_s = np.clip(
        rng.lognormal(math.log(TRAINING_MEDIAN_S), TRAINING_LOG_SIGMA, size=count), TRAINING_MIN_S, TRAINING_MAX_S
    )
    elastic = rng.random(count) < 0.2
    checkpointed = rng.random(count) < 0.8
    worker = training_worker(queue)
    jobs: list[TimelineJob] = []
    for i, arrival_s in enumerate(times):
        gang = int(gangs[i])
        low, high = elastic_range(gang, bool(elastic[i]))
        jobs.append(
            TimelineJob(
                id=f"{queue}-train-{i:04d}",
                arrival_s=arrival_s,
                request=worker,
                duration_s=float(runtime_s[i]),
                job_type=job_types[int(types[i])],
                queue=queue,
                priority=worker.priority,
                preemptible=True,
                gang=gang,
                elastic_min=low,
                elastic_max=high,
                checkpointed=bool(checkpointed[i]),
            )
        )
    return jobs


def _best_effort_jobs(rng: np.random.Generator, queue: str, times: list[float]) -> list[TimelineJob]:
    count = len(times)
    milli = rng.choice(np.array(BEST_EFFORT_MILLI), size=count)
    runtime_s = rng.lognormal(math.log(BEST_EFFORT_MEDIAN_S), BEST_EFFORT_LOG_SIGMA, size=count)
    jobs: list[TimelineJob] = []
    for i, arrival_s in enumerate(times):
        request = Request(
            num_gpus=1,
            gpu_milli=int(milli[i]),
            cpu_milli=2000,
            mem_mib=8 * MIB_PER_GIB,
            priority=PRIORITY_BEST_EFFORT,
            queue=queue,
        )
        jobs.append(
            TimelineJob(
                f"{queue}-be-{i:04d}",
                arrival_s,
                request,
                float(runtime_s[i]),
                queue=queue,
                priority=PRIORITY_BEST_EFFORT,
                preemptible=True,
            )
        )
    return jobs
