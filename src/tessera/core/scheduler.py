"""The scheduling step: ``Scheduler.plan(pending, running, now_s) -> StepPlan``, decisions as data.

One step takes the workloads waiting to run, orders them (priority, then arrival; a queue discipline decides whether
a workload that does not fit blocks those behind it), and places what fits with the configured placement policy.
It never launches anything and never reads a clock: the simulator and the control plane apply the ``Bind`` and
``Preempt`` decisions themselves (``ClusterState.bind`` / ``release``) and call ``plan`` again after the next event.
Placements within one step are tried on the live ``ClusterState`` and rolled back before ``plan`` returns, so the
returned plan is consistent (no two binds overlap) and the state is left untouched.

Gang workloads (``gang > 1`` workers of the same request) are placed all or nothing. A request that does not fit
leaves a one-line reason in ``StepPlan.waiting`` (shown by ``tessera show`` in the control plane).

**Queues and quotas** (``SchedulerConfig.queues``; without queues the step is exactly the one above). The scheduler
owns a ``QuotaLedger``. A workload is bound only if ``can_admit(queue, flavor, demand)`` (flavor ``"*"`` unless its
queue has a quota entry for the one GPU model it asks for; demand = GPU milli, CPU and memory of all its workers);
each ``Bind`` carries the ``Admission``. The runtime charges a bind with ``charge(bind)`` when it applies it and
returns the quota with ``release(admission)`` when the workload stops. Queues take turns in weighted DRF order
(lowest dominant share first, recomputed after every bind); within a queue the order is priority then arrival, with
the queue's StrictFIFO or BestEffortFIFO strategy. With ``SchedulerConfig.preemption`` set, a workload that cannot be
admitted (its quota is lent out, or no node fits it) asks ``core.preemption.select_victims`` for running workloads
to stop (reclaim of borrowed capacity across queues, or lower priority within its queue, under the no-loop rule and
``PreemptionGuard``); when stopping them makes the workload fit, the plan holds ``Preempt`` decisions for them and the
workload's ``Bind``. The runtime applies every ``Preempt`` before the binds.
"""

from __future__ import annotations

import enum
import itertools
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from tessera.core.cluster import ClusterState
from tessera.core.placement.base import Placer
from tessera.core.preemption import Candidate, PreemptionGuard, PreemptionPolicy, select_victims
from tessera.core.queueing.fairshare import drf_order
from tessera.core.queueing.priority import order_pending
from tessera.core.queueing.quotas import Admission, QueueSpec, QuotaLedger
from tessera.core.queueing.resources import ANY_FLAVOR, Flavor, ResourceVector
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


@dataclass(frozen=True, slots=True)
class RunningWorkload:
    """What the step needs to know about a running workload to consider it as a preemption victim."""

    workload_id: str
    queue: str
    priority: int
    placements: tuple[Placement, ...]  # where it runs (released on the state while a preemption is tried)
    admission: Admission  # how its queue was charged (``Scheduler.charge``)
    started_s: float  # when it (re)started
    preemptible: bool = True
    checkpointed: bool = False


@dataclass(frozen=True, slots=True)
class Bind:
    workload_id: str
    placements: tuple[Placement, ...]  # one per worker
    admission: Admission | None = None  # the quota charge (None without queues); apply with Scheduler.charge


@dataclass(frozen=True, slots=True)
class Preempt:
    workload_id: str  # the running workload to stop (its placements and quota are released)
    reason: str  # one line: "reclaim" (another queue takes back its nominal quota) or "priority", and for whom
    preemptor: str = ""  # the pending workload it makes room for


@dataclass(frozen=True, slots=True)
class StepPlan:
    binds: tuple[Bind, ...] = ()
    waiting: dict[str, str] = field(default_factory=dict)  # workload id -> why it is still pending
    preempts: tuple[Preempt, ...] = ()  # applied before the binds


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    discipline: QueueDiscipline = QueueDiscipline.BEST_EFFORT_FIFO  # without queues; with them, each queue's strategy
    max_attempts_per_step: int = 10_000  # bound on placement attempts in one step (keeps a step's cost bounded)
    queues: tuple[QueueSpec, ...] = ()  # tenant queues with quotas; empty = no quotas (one implicit queue)
    preemption: PreemptionPolicy | None = None  # None: never preempt


class Scheduler:
    """Plans binds (and, with queues and a preemption policy, preemptions) on one cluster with one placement engine."""

    def __init__(self, placer: Placer, config: SchedulerConfig = SchedulerConfig()) -> None:
        self.placer = placer
        self.config = config
        self.ledger: QuotaLedger | None = QuotaLedger(config.queues) if config.queues else None

    @property
    def state(self) -> ClusterState:
        return self.placer.state

    def charge(self, bind: Bind) -> Admission | None:
        """Charge an applied bind to its queue's quota; the admission to keep until ``release`` (None: no queues).
        Preemptions of the same plan must be applied first (releasing can only make room)."""
        if self.ledger is None or bind.admission is None:
            return None
        admission = bind.admission
        return self.ledger.admit(admission.queue, admission.flavor_key, _charged(admission))

    def release(self, admission: Admission | None) -> None:
        """Return the quota of a workload that stopped (finished or preempted)."""
        if self.ledger is not None and admission is not None:
            self.ledger.release(admission.queue, admission.flavor_key, _charged(admission))

    def blocked_by_borrowers(self, workload: PendingWorkload) -> bool:
        """True when the workload fits within its queue's unused nominal quota but cannot be admitted: other queues
        borrow that quota (what reclaim exists for; a runtime measures how long this lasts)."""
        if self.ledger is None:
            return False
        flavor = _flavor(self.ledger.spec(workload.queue), workload.request)
        demand = _demand(workload)
        return self.ledger.fits_within_nominal(workload.queue, flavor, demand) and (
            self.ledger.can_admit(workload.queue, flavor, demand) is None
        )

    def plan(
        self,
        pending: Sequence[PendingWorkload],
        rng: np.random.Generator,
        running: Sequence[RunningWorkload] = (),
        now_s: float = 0.0,
        guard: PreemptionGuard | None = None,
    ) -> StepPlan:
        """One step. ``running`` (preemption candidates), ``now_s`` and ``guard`` matter only with queues and a
        preemption policy; without queues the step is the single-queue one of the module docstring."""
        if self.ledger is None:
            return self._plan_unqueued(pending, rng)
        step = _QuotaStep(self, self.ledger.copy(), rng, running, now_s, guard)
        return step.run(pending)

    def _plan_unqueued(self, pending: Sequence[PendingWorkload], rng: np.random.Generator) -> StepPlan:
        binds: list[Bind] = []
        waiting: dict[str, str] = {}
        tried: list[Placement] = []
        blocked_shapes: set[tuple[Request, int]] = set()
        attempts = 0
        blocked = False
        try:
            for workload in order_pending(pending):
                shape = (workload.request, workload.gang)
                if blocked or shape in blocked_shapes or attempts >= self.config.max_attempts_per_step:
                    waiting[workload.workload_id] = (
                        "waiting behind an earlier workload" if blocked else _no_fit(workload)
                    )
                    continue
                attempts += 1
                placements = self._place_gang(workload, rng, tried)
                if placements is None:
                    waiting[workload.workload_id] = _no_fit(workload)
                    blocked_shapes.add(shape)  # the state only fills up during a step: the same shape fails too
                    blocked = self.config.discipline is QueueDiscipline.STRICT_FIFO
                    continue
                binds.append(Bind(workload.workload_id, placements))
        finally:
            for placement in reversed(tried):
                self.state.release(placement)
        return StepPlan(tuple(binds), waiting)

    def _place_gang(
        self, workload: PendingWorkload, rng: np.random.Generator, tried: list[Placement]
    ) -> tuple[Placement, ...] | None:
        placed: list[Placement] = []
        for _ in range(workload.gang):
            decision = self.placer.decide(workload.request, rng)
            if decision is None:
                for placement in reversed(placed):
                    self.state.release(placement)
                    tried.remove(placement)
                return None
            self.state.bind(decision)
            tried.append(decision)
            placed.append(decision)
        return tuple(placed)


class _QuotaStep:
    """One quota-aware step (module docstring): queues in DRF order, admission against a copy of the ledger,
    preemption when a workload cannot be admitted. Placements and victims' releases are tried on the live state and
    undone before ``run`` returns."""

    def __init__(
        self,
        scheduler: Scheduler,
        ledger: QuotaLedger,
        rng: np.random.Generator,
        running: Sequence[RunningWorkload],
        now_s: float,
        guard: PreemptionGuard | None,
    ) -> None:
        self.scheduler = scheduler
        self.ledger = ledger
        self.rng = rng
        self.running = {r.workload_id: r for r in running}
        self.now_s = now_s
        self.guard = guard
        nodes = scheduler.state.nodes
        self.capacity = ResourceVector(
            scheduler.state.gpu_capacity_milli, sum(n.cpu_milli for n in nodes), sum(n.mem_mib for n in nodes)
        )
        self.tried: list[Placement] = []  # binds of this step, bound on the state
        self.stopped: list[RunningWorkload] = []  # victims of this step, released on the state
        self.binds: list[Bind] = []
        self.preempts: list[Preempt] = []
        self.waiting: dict[str, str] = {}
        self.blocked_shapes: set[tuple[str, int, Request, int]] = set()
        self.attempts = 0

    def run(self, pending: Sequence[PendingWorkload]) -> StepPlan:
        queues: dict[str, deque[PendingWorkload]] = {}
        for workload in order_pending(pending):
            queues.setdefault(workload.queue, deque()).append(workload)
        try:
            while queues:
                name = self._next_queue(queues)
                workload = queues[name].popleft()
                admitted = self._try(workload)
                if not admitted and self.ledger.spec(name).strategy == "StrictFIFO":
                    for rest in queues[name]:
                        self.waiting[rest.workload_id] = "waiting behind an earlier workload"
                    queues[name].clear()
                if not queues[name]:
                    del queues[name]
        finally:
            for placement in reversed(self.tried):
                self.scheduler.state.release(placement)
            for victim in reversed(self.stopped):
                for placement in victim.placements:
                    self.scheduler.state.bind(placement)
        return StepPlan(tuple(self.binds), self.waiting, tuple(self.preempts))

    def _next_queue(self, queues: dict[str, deque[PendingWorkload]]) -> str:
        """The queue with pending work and the lowest weighted dominant share (DRF)."""
        usages = []
        for name in queues:
            spec = self.ledger.spec(name)
            usage = ResourceVector.zero()
            for key in spec.nominal:
                usage = usage + self.ledger.usage(name, key)
            usages.append((name, spec.weight, usage))
        return drf_order(usages, self.capacity)[0]

    def _try(self, workload: PendingWorkload) -> bool:
        shape = (workload.queue, workload.priority, workload.request, workload.gang)
        if shape in self.blocked_shapes or self.attempts >= self.scheduler.config.max_attempts_per_step:
            self.waiting[workload.workload_id] = _no_fit(workload)
            return False
        self.attempts += 1
        flavor = _flavor(self.ledger.spec(workload.queue), workload.request)
        demand = _demand(workload)
        admission = self.ledger.can_admit(workload.queue, flavor, demand)
        if admission is not None:
            placements = self.scheduler._place_gang(workload, self.rng, self.tried)
            if placements is not None:
                self._bind(workload, flavor, demand, placements)
                return True
        if self._preempt_for(workload, flavor, demand, quota_blocked=admission is None):
            return True
        self.blocked_shapes.add(shape)
        self.waiting[workload.workload_id] = (
            _no_fit(workload) if admission is not None else f"queue {workload.queue} has no quota for {demand} now"
        )
        return False

    def _bind(
        self, workload: PendingWorkload, flavor: Flavor, demand: ResourceVector, placements: tuple[Placement, ...]
    ) -> None:
        admission = self.ledger.admit(workload.queue, flavor, demand)
        self.binds.append(Bind(workload.workload_id, placements, admission))

    def _preempt_for(
        self, workload: PendingWorkload, flavor: Flavor, demand: ResourceVector, quota_blocked: bool
    ) -> bool:
        """Stop running workloads so that ``workload`` is admitted and placed, if the policy and the no-loop rule
        allow a set that works; True when it was bound."""
        policy = self.scheduler.config.preemption
        need = self.ledger.quota_need(workload.queue, flavor, demand) if policy is not None else None
        if need is None:
            return False
        candidates = self._candidates(workload, flavor)
        if not candidates:
            return False
        # First the victims the quota and the cluster-wide need ask for; their capacity may be spread over nodes the
        # workload does not fit on, so then the nodes holding the most preemptible capacity one at a time, asking
        # each for what the workload lacks there.
        first = (ResourceVector.zero() if quota_blocked else demand, candidates)
        by_node = (
            ((demand - self._node_free(node)).positive_part(), node_candidates)
            for node, node_candidates in self._candidates_by_node(candidates)[:_NODES_TO_TRY]
        )
        for needed, pool in itertools.chain([first], by_node):
            victim_ids = select_victims(
                workload.queue, workload.priority, needed, pool, self.now_s, policy, quota=need, guard=self.guard
            )
            if victim_ids and self._stop_and_place(workload, flavor, demand, victim_ids):
                return True
        return False

    def _stop_and_place(
        self, workload: PendingWorkload, flavor: Flavor, demand: ResourceVector, victim_ids: Sequence[str]
    ) -> bool:
        """Release ``victim_ids`` and place ``workload``; keep the result if it was admitted and placed, else undo."""
        victims = [self.running[v] for v in victim_ids]
        snapshot = self.ledger.copy()
        for victim in victims:
            for placement in victim.placements:
                self.scheduler.state.release(placement)
            self.ledger.release(victim.queue, victim.admission.flavor_key, _charged(victim.admission))
        placements = None
        if self.ledger.can_admit(workload.queue, flavor, demand) is not None:
            placements = self.scheduler._place_gang(workload, self.rng, self.tried)
        if placements is None:  # stopping them would not make it fit: undo
            self.ledger = snapshot
            for victim in reversed(victims):
                for placement in victim.placements:
                    self.scheduler.state.bind(placement)
            return False
        for victim in victims:
            del self.running[victim.workload_id]
            self.stopped.append(victim)
            kind = "priority" if victim.queue == workload.queue else f"reclaim by queue {workload.queue}"
            reason = f"{kind} for {workload.workload_id}"
            self.preempts.append(Preempt(victim.workload_id, reason, workload.workload_id))
        self._bind(workload, flavor, demand, placements)
        return True

    def _candidates_by_node(self, candidates: Sequence[Candidate]) -> list[tuple[int, list[Candidate]]]:
        """Candidates grouped by the nodes they run on, the nodes with the most preemptible GPU first."""
        by_node: dict[int, list[Candidate]] = {}
        for candidate in candidates:
            for node in {p.node for p in self.running[candidate.workload_id].placements}:
                by_node.setdefault(node, []).append(candidate)
        return sorted(by_node.items(), key=lambda item: (-sum(c.frees.gpu_milli for c in item[1]), item[0]))

    def _node_free(self, node: int) -> ResourceVector:
        state = self.scheduler.state
        return ResourceVector(
            int(state.gpu_free_milli[node].sum()), int(state.cpu_free_milli[node]), int(state.mem_free_mib[node])
        )

    def _candidates(self, workload: PendingWorkload, flavor: Flavor) -> list[Candidate]:
        """Running workloads of the preemptor's queue, or of its cohort in the same flavor pool."""
        spec = self.ledger.spec(workload.queue)
        key = spec.flavor_key(flavor)
        found = []
        for r in self.running.values():
            same_pool = r.admission.flavor_key == key
            if r.queue != workload.queue and not (
                same_pool and spec.cohort is not None and self.ledger.spec(r.queue).cohort == spec.cohort
            ):
                continue
            # Borrowed only while its queue is above nominal now: reclaiming it then really returns capacity.
            borrowed = r.admission.is_borrowing and not self.ledger.borrowed(r.queue, r.admission.flavor_key).is_zero()
            found.append(
                Candidate(
                    r.workload_id,
                    r.queue,
                    r.priority,
                    r.preemptible,
                    r.started_s,
                    r.checkpointed,
                    _charged(r.admission),
                    borrowed,
                )
            )
        return found


_NODES_TO_TRY = 8  # node-targeted preemption attempts per workload and step (bounds a step's cost)


def _charged(admission: Admission) -> ResourceVector:
    return admission.from_nominal + admission.borrowed


def _demand(workload: PendingWorkload) -> ResourceVector:
    """What a workload is charged to its queue: GPU milli, CPU and memory of all its workers."""
    r = workload.request
    return ResourceVector(r.total_gpu_milli * workload.gang, r.cpu_milli * workload.gang, r.mem_mib * workload.gang)


def _flavor(spec: QueueSpec, request: Request) -> Flavor:
    """The GPU model the request is limited to when the queue has a quota for exactly that model, else ``"*"``."""
    if len(request.gpu_types) == 1:
        (model,) = request.gpu_types
        if model in spec.nominal:
            return model
    return ANY_FLAVOR


def _no_fit(workload: PendingWorkload) -> str:
    r = workload.request
    if r.num_gpus == 0:
        what = f"{r.cpu_milli / 1000:g} CPUs"
    elif r.is_sharing:
        what = f"a GPU with {r.gpu_milli / 10:g}% free"
    else:
        what = f"{r.num_gpus} free GPU{'s' if r.num_gpus > 1 else ''}"
    types = f" of type {'/'.join(sorted(r.gpu_types))}" if r.gpu_types and r.num_gpus else ""
    gang = f" for each of {workload.gang} workers" if workload.gang > 1 else ""
    return f"no node has {what}{types} and {r.cpu_milli / 1000:g} CPUs free{gang}"
