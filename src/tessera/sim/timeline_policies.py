"""The timeline simulator's policies: configurations of the one scheduling step, and the queues they run on.

``TIMELINE_POLICIES`` names them (see ``tessera.sim.timeline`` for what each does); ``policy_queues`` and
``las_queues`` give the scheduler the queues a policy runs on. Used by ``tessera.sim.timeline`` and the CLI.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from tessera.core.cluster import ClusterState
from tessera.core.errors import InvalidRequestError
from tessera.core.queueing import QueueSpec, ResourceVector
from tessera.core.queueing.las import TIRESIAS_THRESHOLDS_GPU_S, check_thresholds
from tessera.core.scheduler import QueueDiscipline
from tessera.core.workload import MILLI_PER_GPU, Request


@dataclass(frozen=True, slots=True)
class TimelinePolicy:
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
    # physically consistent on workloads with jobs that cannot checkpoint: only for the reference policy below.
    assume_checkpoints: bool = False
    # Elastic jobs start with fewer workers, shrink and grow (SchedulerConfig.elastic, sim.timeline_elastic); off:
    # they replay as rigid gangs.
    elastic: bool = False
    # With elastic: a fixed-duration job with an elastic range is elastic too, its duration being the runtime with the
    # whole gang (only for the reference policy below: a trace's duration is not work that more workers do faster).
    elastic_fixed_durations: bool = False
    # Placement lets two typed training jobs share a GPU only when the co-location model says it is a net gain
    # (``placement.hetero``); the slowdown itself applies under every policy (``sim/colocation.py``).
    colocation_rule: bool = False

    def __post_init__(self) -> None:
        check_thresholds(self.las_thresholds_gpu_s)


TIMELINE_POLICIES: dict[str, TimelinePolicy] = {
    "static": TimelinePolicy("static", "bestfit", True, QueueDiscipline.STRICT_FIFO),
    "fifo-share": TimelinePolicy("fifo-share", "bestfit", False, QueueDiscipline.STRICT_FIFO),
    "tiresias": TimelinePolicy(
        "tiresias", "bestfit", True, QueueDiscipline.BEST_EFFORT_FIFO, las_thresholds_gpu_s=TIRESIAS_THRESHOLDS_GPU_S
    ),
    "gavel": TimelinePolicy("gavel", "hetero", True, QueueDiscipline.BEST_EFFORT_FIFO),
    "tessera": TimelinePolicy(
        "tessera",
        "hetero",
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
# Accepted by --policies but not run by default (docs/scheduling-over-time.md): the paper's assumption that every job
# checkpoints, kept to show how much of tiresias' result on a workload rests on it; tessera without elastic jobs
# (before/after comparisons); tessera treating fixed durations with an elastic range as whole-gang runtimes; tessera
# sharing GPUs between training jobs whatever the co-location model says; tessera whose backfill never delays the
# first blocked job of a queue (EASY-style head reservation).
REFERENCE_POLICIES: dict[str, TimelinePolicy] = {
    "tiresias-all-checkpointed": dataclasses.replace(
        TIMELINE_POLICIES["tiresias"], name="tiresias-all-checkpointed", assume_checkpoints=True
    ),
    "tessera-rigid": dataclasses.replace(TIMELINE_POLICIES["tessera"], name="tessera-rigid", elastic=False),
    "tessera-elastic-durations": dataclasses.replace(
        TIMELINE_POLICIES["tessera"], name="tessera-elastic-durations", elastic_fixed_durations=True
    ),
    "tessera-any-colocation": dataclasses.replace(
        TIMELINE_POLICIES["tessera"], name="tessera-any-colocation", colocation_rule=False
    ),
    "tessera-head-reservation": dataclasses.replace(
        TIMELINE_POLICIES["tessera"], name="tessera-head-reservation", head_reservation=True
    ),
}
PREEMPTION_MIN_RUNTIME_S = 600.0  # PreemptionGuard: a preempted job runs this long before priority may preempt it


def whole_gpu_request(request: Request) -> Request:
    """The request as static binding sees it: any GPU share becomes whole GPUs."""
    if request.num_gpus == 0 or request.gpu_milli == MILLI_PER_GPU:
        return request
    return dataclasses.replace(request, gpu_milli=MILLI_PER_GPU, gpu_mem_mib=0)


def resolve_policy(name: str) -> TimelinePolicy:
    policy = TIMELINE_POLICIES.get(name) or REFERENCE_POLICIES.get(name)
    if policy is None:
        known = ", ".join([*TIMELINE_POLICIES, *REFERENCE_POLICIES])
        raise InvalidRequestError("--policies", f"unknown timeline policy {name!r} (known: {known})")
    return policy


def policy_queues(queues: Sequence[QueueSpec], policy: TimelinePolicy) -> tuple[QueueSpec, ...]:
    """The queues as ``policy`` runs them: as given (BestEffortFIFO) when it borrows, else alone at nominal quota
    with the policy's discipline."""
    if policy.borrowing:
        return tuple(dataclasses.replace(q, strategy="BestEffortFIFO") for q in queues)
    backfill = policy.discipline is QueueDiscipline.BEST_EFFORT_FIFO
    return tuple(
        QueueSpec(q.name, None, q.nominal, weight=q.weight, strategy="BestEffortFIFO" if backfill else "StrictFIFO")
        for q in queues
    )


def las_queues(state: ClusterState) -> tuple[QueueSpec, ...]:
    """Without tenant queues, LAS runs on one queue whose quota is the whole cluster: it never limits admission but
    lets the scheduler's within-queue preemption by priority act (the quota-aware step is the one that preempts)."""
    nodes = state.nodes
    whole = ResourceVector(state.gpu_capacity_milli, sum(n.cpu_milli for n in nodes), sum(n.mem_mib for n in nodes))
    return (QueueSpec(LAS_QUEUE, None, {"*": whole}, strategy="BestEffortFIFO"),)


LAS_QUEUE = "default"
