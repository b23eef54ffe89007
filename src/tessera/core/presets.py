"""Named scheduling policies (presets): configurations of the one scheduler, for the simulator and the server alike.

``PRESETS`` are the policies the timeline results compare (``static``, ``fifo-share``, ``tiresias``, ``gavel``,
``tessera``; docs/scheduling-over-time.md says what each does), ``REFERENCE_PRESETS`` variants kept for before/after
comparisons. ``build_scheduler`` turns a preset, a cluster and tenant queues into a ``Scheduler``: placement policy,
queue discipline, the queues it runs on (``preset_queues``), preemption, LAS, elastic workloads, head reservation.
``tessera simulate timeline --policies`` and ``tessera up --policy`` both resolve names here (``resolve_preset``).

- ``static``: whole GPUs per workload (a fractional request takes a whole GPU), strict FIFO, no sharing: the static
  binding Tessera replaces;
- ``fifo-share``: fractional GPUs, strict FIFO, best-fit placement;
- ``tiresias``: discretised two-dimensional LAS (Tiresias, NSDI '19): whole GPUs, best-fit placement, no sharing. A
  job's priority is its LAS queue (``core.queueing.las``): attained service = GPUs × seconds run, thresholds
  ``TIRESIAS_THRESHOLDS_GPU_S`` = 1 and 10 GPU-hours (three queues), less service first, FIFO within a queue, with
  backfill. The scheduler's ordinary within-queue preemption by priority does the rest: a waiting job that does not
  fit preempts running jobs of lower LAS queues (``core.preemption.select_victims``: fewest, then youngest victims;
  ``Preempt`` decisions). Without tenant queues the scheduler runs on one queue whose quota is the whole cluster
  (``one_queue``) so that the quota-aware, preempting step runs. Every run is recorded in the ``PreemptionGuard`` when
  it is bound (``Scheduler.commit``), so no job is preempted before it has run ``PREEMPTION_MIN_RUNTIME_S`` (against
  thrashing). Running jobs' priorities are recomputed at each step (the simulator steps again at each threshold
  crossing and guard expiry; the server steps continually). As in the paper, preemption suspends a job to its
  checkpoint and resumes it later (remaining work kept, no restart overhead), whatever its priority class; a job the
  workload marks as unable to checkpoint is therefore never preempted (preempting it would restart it from zero, which
  measured worse: openb 7.67 h against 7.22 h average JCT). The reference policy ``tiresias-all-checkpointed`` instead
  assumes every job can checkpoint, as the paper does; it is not physically consistent on workloads with jobs that
  cannot. Simplified: no Gittins-index variant, no starvation promotion, no consolidation beyond best-fit; victims are
  chosen by the no-loop rule's cost (fewest, youngest), not strictly from the lowest queue first;
- ``gavel``: heterogeneity-aware scheduling after Gavel (OSDI '20), simplified: whole GPUs, no sharing, no
  preemption, backfill, and ``hetero`` placement (the GPU type on which the job type runs fastest, from the
  throughput model; best-fit among equally fast ones and for requests without a job type). Gavel solves a max-min
  fairness program over normalized effective throughput and time-shares GPUs in rounds (leases of ~6 min, with
  preemption); here there are no rounds, so every waiting job has received a normalized throughput of 0 and the
  max-min order reduces to the ordinary order (priority, then arrival); what remains of Gavel is the
  heterogeneity-aware choice of GPU type (and no space sharing, unlike ``tessera``);
- ``tessera``: fractional GPUs, priority order with backfill (BestEffortFIFO), Tessera's own placement
  ``tessera-hetero`` (``placement.tessera_hetero``): the GPU model on which the job type runs fastest (as ``hetero``),
  best fit among those nodes, and among equally good ones Tessera's fragmentation measure learnt from the requests
  (``tessera-online``), which also picks the GPU a share takes; it is given no typical pods, so the simulator and the
  server run the same policy. Against ``hetero`` (docs/scheduling-over-time.md, "Placement"): openb timeline 7.1959 h
  against 7.1964 h average JCT, training seeds 0-9 3.358 h against 3.333 h (hetero with random tie-breaks instead
  of the first node: 3.35 to 3.41 h), tenants seeds 0-2 1.260 h against 1.264 h. Ranking by the fragmentation
  measure before best fit measured worse where work also leaves (openb: 7.49 h with ``tessera-online``, 7.58 h with
  ``tessera``): it spreads small pods over idle 8-GPU nodes that big pods then wait for. Within a priority class,
  preemptible and checkpointed jobs are ordered by least attained service (LAS, as tiresias) and may be preempted
  for a job of a lower LAS level; services and non-checkpointed jobs are never preempted for that (restarting a job
  from zero to serve a shorter one loses more than it gains). Every run's preemption guard holds back only its own
  class (LAS churn): a higher class (inference-critical over training) preempts it at once, unless the run was
  bound in the same instant. Elastic jobs (``Preset.elastic``, tessera
  only: the baselines run them as rigid gangs; ``Preset.elastic_bounds``): a job with ``work_steps`` and an
  elastic range starts with the most workers that fit (at least its minimum), gives workers back instead of being
  preempted whole (grown ones to any pending job of its queue, the others to higher priority or to a queue
  reclaiming its quota) and grows into idle GPUs its quota admits; its runtime follows its worker count (linear
  scaling of the whole-gang runtime). Fixed-duration jobs are never elastic. A typed share joins a GPU only when it
  holds no other typed job or one with which sharing is a net gain (``Preset.colocation_rule``,
  ``placement.hetero``). Reference policies: ``tessera-rigid`` (elastic off), ``tessera-elastic-durations`` (fixed
  durations with an elastic range taken as whole-gang runtimes) and ``tessera-any-colocation`` (no co-location rule).

What a preset changes outside the scheduler is the request a workload asks for (``Preset.request_of``: static
binding rounds GPU shares up to whole GPUs) and, for the simulator, which jobs are elastic (``elastic_bounds``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from tessera.core.cluster import ClusterState
from tessera.core.decisions import QueueDiscipline, SchedulerConfig
from tessera.core.errors import InvalidRequestError
from tessera.core.fragmentation import TypicalPod
from tessera.core.placement import Placer, make_policy
from tessera.core.placement.base import TieBreak
from tessera.core.preemption import PreemptionPolicy
from tessera.core.queueing import QueueSpec, ResourceVector
from tessera.core.queueing.las import TIRESIAS_THRESHOLDS_GPU_S, check_thresholds
from tessera.core.scheduler import Scheduler
from tessera.core.throughput import ColocationModel, ThroughputModel
from tessera.core.workload import MILLI_PER_GPU, Request

PREEMPTION_MIN_RUNTIME_S = 600.0  # PreemptionGuard: a preempted job runs this long before priority may preempt it
ONE_QUEUE = "default"  # without tenant queues, LAS and tessera run on one whole-cluster queue of this name


@dataclass(frozen=True, slots=True)
class Preset:
    name: str
    placement: str  # placement policy name (tessera.core.placement)
    whole_gpus: bool  # round every GPU share up to whole GPUs (static binding)
    discipline: QueueDiscipline
    borrowing: bool = False  # with queues: borrow idle quota in a cohort and reclaim it by preemption
    # Non-empty: discretised LAS (core.queueing.las): priority from attained GPU-seconds, preemption by priority.
    las_thresholds_gpu_s: tuple[float, ...] = ()
    # With LAS: keep the job's priority class first and apply LAS only among preemptible jobs of one class.
    las_within_class: bool = False
    # A gang goes onto one node of the chosen GPU model when one can hold it (baselines place workers one by one).
    gang_one_node: bool = False
    # BestEffortFIFO: the first job that cannot start reserves capacity at its expected start; later jobs backfill
    # only where they do not delay it (SchedulerConfig.head_reservation).
    head_reservation: bool = False
    # Every preempted job resumes from a checkpoint, whatever the workload says (Tiresias' own assumption). Not
    # physically consistent on workloads with jobs that cannot checkpoint: only for the reference preset below.
    assume_checkpoints: bool = False
    # Elastic jobs start with fewer workers, shrink and grow (SchedulerConfig.elastic); off: they run as rigid gangs.
    elastic: bool = False
    # With elastic: a fixed-duration job with an elastic range is elastic too, its duration being the runtime with the
    # whole gang (only for the reference preset below: a trace's duration is not work that more workers do faster).
    elastic_fixed_durations: bool = False
    # Placement lets two typed training jobs share a GPU only when the co-location model says it is a net gain
    # (``placement.hetero``); the simulator applies the slowdown itself under every preset.
    colocation_rule: bool = False

    def __post_init__(self) -> None:
        check_thresholds(self.las_thresholds_gpu_s)

    def request_of(self, request: Request) -> Request:
        """The request as this preset places it: any GPU share becomes whole GPUs under static binding."""
        return whole_gpu_request(request) if self.whole_gpus else request

    def elastic_bounds(
        self, elastic_min: int | None, elastic_max: int | None, fixed_duration: bool
    ) -> tuple[int | None, int | None]:
        """``(elastic_min, elastic_max)`` the scheduler sees for a workload with that range: the range when the
        preset runs elastic workloads and the workload's runtime is work that more workers do faster (a trace's
        fixed duration is not, except under ``elastic_fixed_durations``), else ``(None, None)`` (rigid)."""
        if not self.elastic or fixed_duration and not self.elastic_fixed_durations:
            return None, None
        if elastic_min is None or elastic_max is None:
            return None, None
        return int(elastic_min), int(elastic_max)


PRESETS: dict[str, Preset] = {
    "static": Preset("static", "bestfit", True, QueueDiscipline.STRICT_FIFO),
    "fifo-share": Preset("fifo-share", "bestfit", False, QueueDiscipline.STRICT_FIFO),
    "tiresias": Preset(
        "tiresias", "bestfit", True, QueueDiscipline.BEST_EFFORT_FIFO, las_thresholds_gpu_s=TIRESIAS_THRESHOLDS_GPU_S
    ),
    "gavel": Preset("gavel", "hetero", True, QueueDiscipline.BEST_EFFORT_FIFO),
    "tessera": Preset(
        "tessera",
        "tessera-hetero",
        False,
        QueueDiscipline.BEST_EFFORT_FIFO,
        borrowing=True,
        las_thresholds_gpu_s=TIRESIAS_THRESHOLDS_GPU_S,
        las_within_class=True,
        gang_one_node=True,
        elastic=True,
        colocation_rule=True,
    ),
}
# Accepted by name but not run by default (docs/scheduling-over-time.md): the paper's assumption that every job
# checkpoints, kept to show how much of tiresias' result on a workload rests on it; tessera without elastic jobs
# (before/after comparisons); tessera treating fixed durations with an elastic range as whole-gang runtimes; tessera
# sharing GPUs between training jobs whatever the co-location model says; tessera whose backfill never delays the
# first blocked job of a queue (EASY-style head reservation).
REFERENCE_PRESETS: dict[str, Preset] = {
    "tiresias-all-checkpointed": dataclasses.replace(
        PRESETS["tiresias"], name="tiresias-all-checkpointed", assume_checkpoints=True
    ),
    "tessera-rigid": dataclasses.replace(PRESETS["tessera"], name="tessera-rigid", elastic=False),
    "tessera-elastic-durations": dataclasses.replace(
        PRESETS["tessera"], name="tessera-elastic-durations", elastic_fixed_durations=True
    ),
    "tessera-any-colocation": dataclasses.replace(
        PRESETS["tessera"], name="tessera-any-colocation", colocation_rule=False
    ),
    "tessera-head-reservation": dataclasses.replace(
        PRESETS["tessera"], name="tessera-head-reservation", head_reservation=True
    ),
}
PRESET_NAMES = (*PRESETS, *REFERENCE_PRESETS)


def resolve_preset(name: str, field: str = "policy") -> Preset:
    """The preset called ``name``; an unknown name is an ``InvalidRequestError`` on ``field``."""
    preset = PRESETS.get(name) or REFERENCE_PRESETS.get(name)
    if preset is None:
        raise InvalidRequestError(field, f"unknown scheduling policy {name!r} (known: {', '.join(PRESET_NAMES)})")
    return preset


def whole_gpu_request(request: Request) -> Request:
    """The request as static binding sees it: any GPU share becomes whole GPUs."""
    if request.num_gpus == 0 or request.gpu_milli == MILLI_PER_GPU:
        return request
    return dataclasses.replace(request, gpu_milli=MILLI_PER_GPU, gpu_mem_mib=0)


def preset_queues(queues: Sequence[QueueSpec], preset: Preset) -> tuple[QueueSpec, ...]:
    """The tenant queues as ``preset`` runs them: as given (BestEffortFIFO) when it borrows, else alone at nominal
    quota with the preset's discipline."""
    if preset.borrowing:
        return tuple(dataclasses.replace(q, strategy="BestEffortFIFO") for q in queues)
    backfill = preset.discipline is QueueDiscipline.BEST_EFFORT_FIFO
    return tuple(
        QueueSpec(q.name, None, q.nominal, weight=q.weight, strategy="BestEffortFIFO" if backfill else "StrictFIFO")
        for q in queues
    )


def one_queue(state: ClusterState) -> tuple[QueueSpec, ...]:
    """Without tenant queues, LAS and tessera run on one queue whose quota is the whole cluster: it never limits
    admission but lets the scheduler's within-queue preemption by priority act (the quota-aware step preempts)."""
    nodes = state.nodes
    whole = ResourceVector(state.gpu_capacity_milli, sum(n.cpu_milli for n in nodes), sum(n.mem_mib for n in nodes))
    return (QueueSpec(ONE_QUEUE, None, {"*": whole}, strategy="BestEffortFIFO"),)


def runs_on_one_queue(preset: Preset, queues: Sequence[QueueSpec]) -> bool:
    """Whether ``preset`` runs on the one whole-cluster queue (no tenant queues, but LAS or borrowing)."""
    return not queues and (bool(preset.las_thresholds_gpu_s) or preset.borrowing)


def scheduler_config(
    preset: Preset, state: ClusterState, queues: Sequence[QueueSpec] = (), max_attempts_per_step: int = 10_000
) -> SchedulerConfig:
    """The scheduler configuration of ``preset`` on ``state`` with tenant ``queues`` (may be empty)."""
    single = runs_on_one_queue(preset, queues)
    scheduler_queues = preset_queues(queues, preset) if queues else one_queue(state) if single else ()
    preemption = None
    if queues and preset.borrowing:  # reclaim borrowed quota across queues, and priority within a queue
        preemption = PreemptionPolicy()
    elif preset.las_thresholds_gpu_s or single:  # priority (or LAS level) within a queue, never across queues
        preemption = PreemptionPolicy(within_queue=True, reclaim=False)
    return SchedulerConfig(
        discipline=preset.discipline,
        max_attempts_per_step=max_attempts_per_step,
        queues=scheduler_queues,
        preemption=preemption,
        gang_one_node=preset.gang_one_node,
        head_reservation=preset.head_reservation,
        elastic=preset.elastic,
        las_thresholds_gpu_s=preset.las_thresholds_gpu_s,
        las_within_class=preset.las_within_class,
        assume_checkpoints=preset.assume_checkpoints,
        preemption_min_runtime_s=PREEMPTION_MIN_RUNTIME_S,
    )


def build_scheduler(
    preset: Preset,
    state: ClusterState,
    queues: Sequence[QueueSpec] = (),
    *,
    seed: int = 0,
    typical: Sequence[TypicalPod] = (),
    throughput: ThroughputModel | None = None,
    colocation: ColocationModel | None = None,
    tie_break: TieBreak = TieBreak.FIRST,
    max_attempts_per_step: int = 10_000,
    placement: str | None = None,
) -> Scheduler:
    """A scheduler running ``preset`` on ``state``: its placement policy (``placement`` overrides the preset's;
    ``typical`` pods for fragmentation-aware ones; the throughput model and, with the preset's co-location rule, the
    co-location model for ``hetero``), its configuration, and a generator seeded with ``seed``."""
    job_type_of: Callable[[Request], str | None] = lambda request: request.job_type or None  # noqa: E731
    policy = make_policy(
        placement or preset.placement,
        typical,
        state.model_names,
        throughput=throughput or ThroughputModel({}),
        job_type_of=job_type_of,
        colocation=colocation if preset.colocation_rule else None,
    )
    config = scheduler_config(preset, state, queues, max_attempts_per_step)
    return Scheduler(Placer(state, policy, tie_break), config, np.random.default_rng(seed))
