"""One scheduling step (``Scheduler.plan``): queues in DRF order, admission through the quota ledger, placement, and
preemption when a workload cannot be admitted. Without configured queues the same step runs on one implicit queue
with an unlimited quota (``implicit_ledger``): admission never limits, the configured discipline orders it, and a
preemption policy acts within it by priority.

Placements, victims' releases and resizes are tried on the live ``ClusterState`` through one ``core.trial.Trial``
(one undo log, with the step's copy of the ledger), undone before ``run`` returns: the plan is consistent and the
state is left untouched. Pure: no clock (``now_s`` comes in), randomness only from the given generator.
"""

from __future__ import annotations

import copy
import dataclasses
from collections import deque
from collections.abc import Sequence

import numpy as np

from tessera.core.cluster import ClusterState
from tessera.core.decisions import (
    Bind,
    PendingWorkload,
    Preempt,
    RunningWorkload,
    SchedulerConfig,
    StepPlan,
)
from tessera.core.demand import IMPLICIT_QUEUE, amount_text, demand_of, flavor_of, implicit_ledger, no_fit_reason
from tessera.core.placement.base import Placer
from tessera.core.placement.gang import place_gang
from tessera.core.preemption import Candidate, PreemptionGuard, select_victims, select_victims_to_fit
from tessera.core.queueing.fairshare import drf_order
from tessera.core.queueing.las import class_guard
from tessera.core.queueing.priority import order_pending
from tessera.core.queueing.quotas import Admission, QuotaLedger
from tessera.core.queueing.resources import Flavor, ResourceVector
from tessera.core.reservation import Reservation, find_reservation
from tessera.core.step_resize import StepResizes
from tessera.core.trial import Trial
from tessera.core.victim_fit import VictimFit
from tessera.core.workload import Placement, Request


class QuotaStep:
    """One quota-aware step (module docstring): queues in DRF order, admission against a copy of the ledger,
    preemption when a workload cannot be admitted. Placements and victims' releases are tried on the live state and
    undone before ``run`` returns."""

    def __init__(
        self,
        placer: Placer,
        config: SchedulerConfig,
        ledger: QuotaLedger | None,
        rng: np.random.Generator,
        running: Sequence[RunningWorkload],
        now_s: float,
        guard: PreemptionGuard | None,
    ) -> None:
        self.placer = placer
        self.state: ClusterState = placer.state
        self.config = config
        self.implicit = ledger is None  # no configured queues: one implicit, unlimited queue
        if ledger is None:
            ledger, running = implicit_ledger(config, running)
        self.trial = Trial(self.state, ledger)  # every tentative change, undone before run returns
        self.rng = rng
        self.running = {r.workload_id: r for r in running}
        self.now_s = now_s
        self.guard = class_guard(guard, config.las_within_class and bool(config.las_thresholds_gpu_s))
        nodes = self.state.nodes
        self.capacity = ResourceVector(
            self.state.gpu_capacity_milli, sum(n.cpu_milli for n in nodes), sum(n.mem_mib for n in nodes)
        )
        self.binds: list[Bind] = []
        self.preempts: list[Preempt] = []
        self.waiting: dict[str, str] = {}
        self.blocked_shapes: set[tuple[str, int, Request, int, bool, int | None]] = set()
        # Without preemption a shape that failed fails at every priority: one entry for all of them.
        self.priority_matters = config.preemption is not None
        self.attempts = 0
        self.changes = 0  # binds and preemptions so far in this step (invalidates cached candidates)
        self.candidate_cache: dict[tuple[str, Flavor | None], tuple[int, list[Candidate]]] = {}
        # Head reservation: per BestEffortFIFO queue whose head could not be placed, its reservation (None: none
        # could be computed, the queue backfills freely). At most one per queue and step.
        self.reservations: dict[str, Reservation | None] = {}
        self.last_failure = ""  # why the last ``_try`` failed: "fit", "quota" or "limit"
        # Elastic (``core.elastic``): resizes of running workloads, charged to their queues' quotas.
        self.elastic = config.elastic
        self.resizes = StepResizes(self)

    @property
    def ledger(self) -> QuotaLedger:
        """The step's copy of the quota ledger (the trial's: a rollback may restore an earlier copy)."""
        return self.trial.ledger

    def run(self, pending: Sequence[PendingWorkload]) -> StepPlan:
        queues: dict[str, deque[PendingWorkload]] = {}
        if self.implicit:
            pending = [dataclasses.replace(w, queue=IMPLICIT_QUEUE) for w in pending]
        if self.elastic:  # which queues a grow must leave alone (StepResizes.grow)
            self.resizes.queue_of = {w.workload_id: w.queue for w in pending}
        for workload in order_pending(pending):
            queues.setdefault(workload.queue, deque()).append(workload)
        borrowing: dict[str, deque[PendingWorkload]] = {}
        try:
            # Work within its queue's nominal quota first, then work that would borrow (as Kueue orders a cycle):
            # else a borrower admitted earlier in this step could take quota its owner then cannot reclaim (a
            # workload bound in this step is not yet a running candidate for preemption).
            self._drain(queues, borrowing)
            self._drain(borrowing, None)
            grows = self.resizes.grow() if self.elastic and not self.preempts else []
        finally:
            self.trial.rollback()
        shrinks = tuple(self.resizes.shrinks)
        return StepPlan(tuple(self.binds), self.waiting, tuple(self.preempts), shrinks, tuple(grows))

    def _drain(
        self, queues: dict[str, deque[PendingWorkload]], borrowing: dict[str, deque[PendingWorkload]] | None
    ) -> None:
        """Try the queues' workloads in DRF order; with ``borrowing``, a workload that would borrow is moved there
        instead (with everything behind it under StrictFIFO)."""
        while queues:
            name = self._next_queue(queues)
            workload = queues[name].popleft()
            strict = self.ledger.spec(name).strategy == "StrictFIFO"
            if borrowing is not None and self._would_borrow(workload):
                later = borrowing.setdefault(name, deque())
                later.append(workload)
                if strict:
                    later.extend(queues[name])
                    queues[name].clear()
            elif not self._try_in_queue(workload, strict) and strict:
                where = "" if self.implicit else f" of queue {name}"
                why = self.waiting[workload.workload_id]
                for rest in queues[name]:
                    self.waiting[rest.workload_id] = (
                        f"behind workload {workload.workload_id}{where} (StrictFIFO), which waits: {why}"
                    )
                queues[name].clear()
            if not queues[name]:
                del queues[name]

    def _try_in_queue(self, workload: PendingWorkload, strict: bool) -> bool:
        """``_try``, with head reservation (``SchedulerConfig.head_reservation``) for a BestEffortFIFO queue: the
        queue's first workload that does not fit reserves capacity at its shadow time (``core.reservation``); a later
        one starts only if it is expected to end by then, or within what the reservation leaves free, without
        preempting (a victim that would end by the shadow time may hold capacity the head counts on)."""
        if strict or not self.config.head_reservation:
            return self._try(workload)
        if workload.queue not in self.reservations:
            if self._try(workload):
                return True
            self.reservations[workload.queue] = self._reserve(workload) if self.last_failure == "fit" else None
            return False
        reservation = self.reservations[workload.queue]
        duration = workload.expected_duration_s
        if reservation is None or (duration is not None and self.now_s + duration <= reservation.shadow_s):
            return self._try(workload)
        reservation.mask(self.state)
        try:
            placed = self._try(workload, within_reservation=True)
        finally:
            reservation.unmask(self.state)
        if placed:
            reservation.consume(self.binds[-1].placements)
        elif self.last_failure == "fit":
            head, at = reservation.head_id, reservation.shadow_s
            self.waiting[workload.workload_id] = f"capacity reserved for {head} (expected to start at {at:g} s)"
        return placed

    def _reserve(self, head: PendingWorkload) -> Reservation | None:
        """The head's reservation; its trial placements draw from a copy of the generator (the step's own draws
        stay as they would be without it)."""
        rng = copy.deepcopy(self.rng)

        def place() -> list[Placement] | None:
            placed: list[Placement] = []

            def bind(placement: Placement) -> None:
                self.state.bind(placement)
                placed.append(placement)

            done = place_gang(self.placer, head.request, head.gang, rng, bind, self.config.gang_one_node)
            for placement in reversed(placed):
                self.state.release(placement)
            return placed if done is not None else None

        running = self.running.values()
        return find_reservation(self.state, head.workload_id, head.request, head.gang, running, self.now_s, place)

    def _would_borrow(self, workload: PendingWorkload) -> bool:
        if self.ledger.spec(workload.queue).cohort is None:
            return False
        flavor = flavor_of(self.ledger.spec(workload.queue), workload.request)
        admission = self.ledger.can_admit(workload.queue, flavor, demand_of(workload))
        return admission is not None and admission.is_borrowing

    def _next_queue(self, queues: dict[str, deque[PendingWorkload]]) -> str:
        """The queue with pending work and the lowest weighted dominant share (DRF)."""
        if len(queues) == 1:
            return next(iter(queues))
        usages = []
        for name in queues:
            spec = self.ledger.spec(name)
            usage = ResourceVector.zero()
            for key in spec.nominal:
                usage = usage + self.ledger.usage(name, key)
            usages.append((name, spec.weight, usage))
        return drf_order(usages, self.capacity)[0]

    def _try(self, workload: PendingWorkload, within_reservation: bool = False) -> bool:
        """Admit and place (or preempt for) ``workload``. ``within_reservation``: tried on capacity masked by a
        reservation, so it does not preempt and a failure is not cached for its shape."""
        priority = workload.priority if self.priority_matters else 0
        elastic_min = workload.elastic_min if self.elastic else None
        shape = (workload.queue, priority, workload.request, workload.gang, workload.preemptible, elastic_min)
        self.last_failure = "fit"
        if shape in self.blocked_shapes:
            self.waiting[workload.workload_id] = no_fit_reason(workload)
            return False
        if self.attempts >= self.config.max_attempts_per_step:
            self.last_failure = "limit"
            limit = self.config.max_attempts_per_step
            self.waiting[workload.workload_id] = f"not tried yet: a step tries at most {limit} workloads"
            return False
        self.attempts += 1
        flavor = flavor_of(self.ledger.spec(workload.queue), workload.request)
        demand = demand_of(workload)
        admission = self._admission(workload, flavor, demand)
        if (admission is not None or elastic_min is not None) and self.resizes.place_over_growth(workload, flavor):
            return True
        if not within_reservation and self.elastic and self.resizes.shrink_for(workload, flavor):
            return True
        if not within_reservation and self._preempt_for(workload, flavor, demand, quota_blocked=admission is None):
            return True
        if not within_reservation:
            self.blocked_shapes.add(shape)
        self.last_failure = "fit" if admission is not None else "quota"
        if self.elastic and self._quota_only(workload, flavor):  # only growth asks (StepResizes.grow)
            self.resizes.quota_waits.add(workload.workload_id)
        no_quota = f"queue {workload.queue} has no quota left for {amount_text(demand)}"
        self.waiting[workload.workload_id] = no_fit_reason(workload) if admission is not None else no_quota
        return False

    def _admission(self, workload: PendingWorkload, flavor: Flavor, demand: ResourceVector) -> Admission | None:
        admission = self.ledger.can_admit(workload.queue, flavor, demand)
        if admission is not None and admission.is_borrowing and not workload.preemptible:
            return None  # it could never give borrowed capacity back
        return admission

    def _fewest(self, workload: PendingWorkload) -> int:
        """The fewest workers ``workload`` may start with: its ``elastic_min`` when elastic (at least one, at most
        the gang), else the whole gang."""
        if self.elastic and workload.elastic_min is not None:
            return min(max(workload.elastic_min, 1), workload.gang)
        return workload.gang

    def _quota_only(self, workload: PendingWorkload, flavor: Flavor) -> bool:
        """True when even the fewest workers ``workload`` may start with are not admitted: it waits for quota, not
        for capacity (capacity growth of other cohorts' workloads does not delay it)."""
        fewest = dataclasses.replace(workload, gang=self._fewest(workload))
        return self._admission(fewest, flavor, demand_of(fewest)) is None

    def place_elastic(
        self, workload: PendingWorkload, flavor: Flavor, fewer: bool = True, within_nominal: bool = False
    ) -> bool:
        """Bind the whole gang if it is admitted and fits; else (with ``fewer``), for an elastic workload, the most
        workers (at least ``elastic_min``) that are admitted and fit. ``within_nominal``: only an admission that
        does not borrow (it takes back its own queue's quota). True when it was bound."""
        low = self._fewest(workload) if fewer else workload.gang
        for workers in range(workload.gang, low - 1, -1):
            sized = workload if workers == workload.gang else dataclasses.replace(workload, gang=workers)
            demand = demand_of(sized)
            admission = self._admission(sized, flavor, demand)
            if admission is None or (within_nominal and admission.is_borrowing):
                continue
            placements = self._place_gang(sized)
            if placements is not None:
                self._bind(sized, flavor, demand, placements)
                return True
        return False

    def _place_gang(self, workload: PendingWorkload) -> tuple[Placement, ...] | None:
        """Place every worker (all or nothing, on one node when one can hold them all: ``placement.gang``), bound
        on the state through the trial."""
        placed: list[Placement] = []
        mark = self.trial.mark()

        def bind(placement: Placement) -> None:
            self.trial.bind(placement)
            placed.append(placement)

        one_node = self.config.gang_one_node
        if place_gang(self.placer, workload.request, workload.gang, self.rng, bind, one_node) is None:
            self.trial.rollback(mark)
            return None
        return tuple(placed)

    def _bind(
        self, workload: PendingWorkload, flavor: Flavor, demand: ResourceVector, placements: tuple[Placement, ...]
    ) -> None:
        admission = self.ledger.admit(workload.queue, flavor, demand)
        self.changes += 1
        self.binds.append(Bind(workload.workload_id, placements, None if self.implicit else admission))

    def _preempt_for(
        self, workload: PendingWorkload, flavor: Flavor, demand: ResourceVector, quota_blocked: bool
    ) -> bool:
        """Stop running workloads so that ``workload`` is admitted and placed, if the policy and the no-loop rule
        allow a set that works; True when it was bound."""
        policy = self.config.preemption
        need = self.ledger.quota_need(workload.queue, flavor, demand) if policy is not None else None
        if need is None:
            return False
        candidates = self._candidates(workload, flavor)
        if not candidates:
            return False
        # First the cheapest victims the quota and the cluster-wide amount ask for. Their capacity may be on nodes or
        # GPUs where the workload does not fit (spread over nodes, fractions of shared GPUs): then grow a set of
        # allowed victims, trying the placement, until it fits.
        needed = ResourceVector.zero() if quota_blocked else demand
        victim_ids = select_victims(
            workload.queue, workload.priority, needed, candidates, self.now_s, policy, quota=need, guard=self.guard
        )
        if victim_ids and self._stop_and_place(workload, flavor, demand, victim_ids):
            return True
        search = VictimFit(
            self.state, workload.request, workload.gang, self.running, lambda: self._place_gang(workload), self.trial
        )
        try:
            victim_ids = select_victims_to_fit(
                workload.queue,
                workload.priority,
                candidates,
                self.now_s,
                policy,
                quota=need,
                guard=self.guard,
                fits=search.fits,
                usefulness=search.usefulness,
            )
        finally:
            search.restore()
        return bool(victim_ids) and self._stop_and_place(workload, flavor, demand, victim_ids or ())

    def _stop_and_place(
        self, workload: PendingWorkload, flavor: Flavor, demand: ResourceVector, victim_ids: Sequence[str]
    ) -> bool:
        """Release ``victim_ids`` and place ``workload``; keep the result if it was admitted and placed, else undo."""
        victims = [self.running[v] for v in victim_ids]
        mark = self.trial.mark(with_ledger=True)
        for victim in victims:
            for placement in victim.placements:
                self.trial.release(placement)
            self.ledger.release(victim.queue, victim.admission.flavor_key, victim.admission.charged)
        placements = None
        if self._admission(workload, flavor, demand) is not None:
            placements = self._place_gang(workload)
        if placements is None:  # stopping them would not make it fit: undo
            self.trial.rollback(mark)
            return False
        for victim in victims:
            del self.running[victim.workload_id]
            kind = "priority" if victim.queue == workload.queue else f"reclaim by queue {workload.queue}"
            reason = f"{kind} for {workload.workload_id}"
            self.preempts.append(Preempt(victim.workload_id, reason, workload.workload_id))
        self._bind(workload, flavor, demand, placements)
        return True

    def _candidates(self, workload: PendingWorkload, flavor: Flavor) -> list[Candidate]:
        """Running workloads of the preemptor's queue, or of its cohort in the same flavor pool (cached until the
        step binds or preempts something)."""
        spec = self.ledger.spec(workload.queue)
        key = spec.flavor_key(flavor)
        cached = self.candidate_cache.get((workload.queue, key))
        if cached is not None and cached[0] == self.changes:
            return cached[1]
        above_nominal: dict[tuple[str, Flavor], bool] = {}
        found = []
        for r in self.running.values():
            same_pool = r.admission.flavor_key == key
            if r.queue != workload.queue and not (
                same_pool and spec.cohort is not None and self.ledger.spec(r.queue).cohort == spec.cohort
            ):
                continue
            # Borrowed only while its queue is above nominal now: reclaiming it then really returns capacity.
            pool = (r.queue, r.admission.flavor_key)
            if pool not in above_nominal:
                above_nominal[pool] = not self.ledger.borrowed(*pool).is_zero()
            borrowed = r.admission.is_borrowing and above_nominal[pool]
            known = (r.workload_id, r.queue, r.priority, r.preemptible, r.started_s, r.checkpointed)
            found.append(Candidate(*known, r.admission.charged, borrowed))
        self.candidate_cache[(workload.queue, key)] = (self.changes, found)
        return found
