"""The scheduling step's inputs and outputs, as data: what waits, what runs, and the decisions a step returns.

``tessera.core.scheduler`` re-exports every name here (its public API); the step (``core.step``) reads and builds
them. New fields always have defaults, so callers written against an older version keep working.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from tessera.core.preemption import PreemptionPolicy
from tessera.core.queueing.quotas import Admission, QueueSpec
from tessera.core.workload import Placement, Request


class QueueDiscipline(enum.Enum):
    STRICT_FIFO = "StrictFIFO"  # the first workload that does not fit blocks everything behind it
    BEST_EFFORT_FIFO = "BestEffortFIFO"  # later workloads that fit may start (backfill)


@dataclass(frozen=True, slots=True)
class PendingWorkload:
    workload_id: str
    request: Request  # per worker
    arrival_s: float
    priority: int = 0
    queue: str = "default"
    gang: int = 1  # workers placed all or nothing
    # False: it will never be preempted once running, so it is admitted only within its queue's nominal quota
    # (never by borrowing: borrowed capacity must be returnable to its owner in one step).
    preemptible: bool = True
    # How long it will run once started, when known: with head reservation it may backfill ahead of a blocked head
    # when it ends before the head's reserved start.
    expected_duration_s: float | None = None
    # Elastic (``SchedulerConfig.elastic``): the fewest workers it can start with when all ``gang`` do not fit.
    # None: rigid (all ``gang`` workers or nothing).
    elastic_min: int | None = None
    # Elastic: the most workers it may grow to (None: its gang). Kept in its running entry once bound.
    elastic_max: int | None = None
    # It resumes from a checkpoint when preempted (else it restarts from zero): victims with one are cheaper, and
    # plain LAS preempts only those (``SchedulerConfig.las_thresholds_gpu_s``).
    checkpointed: bool = False


@dataclass(frozen=True, slots=True)
class RunningWorkload:
    """What the step needs to know about a running workload to consider it as a preemption victim."""

    workload_id: str
    queue: str
    priority: int
    placements: tuple[Placement, ...]  # where it runs (released on the state while a preemption is tried)
    admission: Admission  # how its queue was charged (``Scheduler.charge``)
    started_s: float  # when it (re)started
    preemptible: bool = True  # False: never a victim
    checkpointed: bool = False
    expected_end_s: float | None = None  # when it is expected to end (head reservation); None: unknown
    # Elastic (``SchedulerConfig.elastic``): it may give back workers above ``elastic_min`` to a higher-priority
    # pending workload of its queue or to a queue reclaiming borrowed quota, and grow up to ``elastic_max`` workers
    # into idle capacity its quota admits. None: rigid.
    elastic_min: int | None = None
    elastic_max: int | None = None
    # Elastic: the workers it asked for. Workers above it were grown into idle capacity and are given back to any
    # pending workload of its queue, whatever its priority. None: as many as it runs now (none grown).
    gang: int | None = None


@dataclass(frozen=True, slots=True)
class Bind:
    workload_id: str
    placements: tuple[Placement, ...]  # one per worker
    admission: Admission | None = None  # the quota charge (None without queues); applied by Scheduler.commit
    # The pending workload it binds, as the runtime handed it to ``plan`` (``commit`` builds the running entry from
    # it). None only for binds made outside a plan.
    workload: PendingWorkload | None = None


@dataclass(frozen=True, slots=True)
class Preempt:
    workload_id: str  # the running workload to stop (its placements and quota are released)
    reason: str  # one line: "reclaim" (another queue takes back its nominal quota) or "priority", and for whom
    preemptor: str = ""  # the pending workload it makes room for


@dataclass(frozen=True, slots=True)
class Shrink:
    workload_id: str  # the running elastic workload that gives workers back (it keeps running on the rest)
    placements: tuple[Placement, ...]  # the workers it stops (released on the state)
    preemptor: str  # the pending workload it makes room for
    # With configured queues: the part of its charge it gives back (borrowed first); return it with
    # ``Scheduler.release`` and keep ``core.elastic.shrunk_admission`` of the workload's admission. None: no queues.
    admission: Admission | None = None


@dataclass(frozen=True, slots=True)
class Grow:
    workload_id: str  # the running elastic workload that gets more workers
    placements: tuple[Placement, ...]  # the added workers (bound on the state)
    # With configured queues: the added workers' charge (within nominal, or borrowed when the cohort allows and the
    # workload is preemptible); apply with ``Scheduler.charge`` and keep ``core.elastic.grown_admission`` of the
    # workload's admission. None: no queues.
    admission: Admission | None = None


Decision = Shrink | Preempt | Bind | Grow  # what ``Scheduler.commit`` applies, in that order


@dataclass(frozen=True, slots=True)
class StepPlan:
    """Decisions of one step; the runtime applies shrinks, then preempts, then binds, then grows."""

    binds: tuple[Bind, ...] = ()
    waiting: dict[str, str] = field(default_factory=dict)  # workload id -> why it is still pending
    preempts: tuple[Preempt, ...] = ()  # applied before the binds
    shrinks: tuple[Shrink, ...] = ()  # applied first (elastic only)
    grows: tuple[Grow, ...] = ()  # applied last (elastic only)


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    discipline: QueueDiscipline = QueueDiscipline.BEST_EFFORT_FIFO  # without queues; with them, each queue's strategy
    max_attempts_per_step: int = 10_000  # bound on placement attempts in one step (keeps a step's cost bounded)
    queues: tuple[QueueSpec, ...] = ()  # tenant queues with quotas; empty = no quotas (one implicit queue)
    preemption: PreemptionPolicy | None = None  # None: never preempt
    gang_one_node: bool = True  # a gang goes onto one node when one can hold it (else on as few nodes as it can)
    # BestEffortFIFO queues: the first workload that cannot be placed reserves the capacity it will get when running
    # workloads end (their expected_end_s), and later workloads of its queue backfill only where they do not delay
    # it (``core.reservation``). Off: later workloads that fit always start.
    head_reservation: bool = False
    # Elastic workloads (``core.elastic``): a pending one whose gang does not fit starts with the most workers that
    # fit, at least its ``elastic_min``; running ones give workers above their minimum back to a higher-priority
    # pending workload of their queue (or, with a reclaiming preemption policy, to a queue taking back the quota
    # they borrow) before anything is preempted, and grow into capacity left idle that their quota admits when
    # nothing waits for it. Off: elastic fields are ignored (every workload is rigid).
    elastic: bool = False
    # Discretised LAS (``core.queueing.las``; tiresias, tessera): non-empty thresholds make a workload's priority its
    # LAS level from the GPU-seconds it attained (``Allocation.las``); every run is then protected by the preemption
    # guard for its first ``preemption_min_runtime_s`` (with ``las_within_class``, against its own class only: a
    # strictly higher class preempts at once, unless the run was bound in the same instant). ``las_within_class``:
    # the priority class stays first and LAS orders only preemptible workloads of one class.
    las_thresholds_gpu_s: tuple[float, ...] = ()
    las_within_class: bool = False
    # Every preempted workload resumes from a checkpoint, whatever it says (Tiresias' own assumption; a reference).
    assume_checkpoints: bool = False
    # A workload preempted once (under LAS: every run) runs this long before priority may preempt it.
    preemption_min_runtime_s: float = 600.0
