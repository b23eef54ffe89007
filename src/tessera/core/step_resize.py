"""The elastic part of one scheduling step (``SchedulerConfig.elastic``; the rules are in ``core.elastic``).

``StepResizes`` works on its step (``ResizingStep``: the trial with the state and the step's ledger, the running
workloads, and the step's placement of a pending workload), never on its private parts: a pending workload is placed
with the workers other elastic workloads grew above their gang counted as free (``place_over_growth``), elastic
workloads give workers back before anything is preempted whole (``shrink_for``), and running elastic workloads grow into
the capacity left idle (``grow``). Shrinks are recorded with the charge they give back; every change goes through the
step's ``Trial``, which undoes them before the step returns, as for binds.
"""

from __future__ import annotations

import dataclasses
from typing import Protocol

import numpy as np

from tessera.core.decisions import Grow, PendingWorkload, RunningWorkload, SchedulerConfig, Shrink
from tessera.core.elastic import (
    grow_into_idle,
    grown_admission,
    grown_workers,
    placements_charge,
    shrinkable_workers,
    shrunk_admission,
    worker_charge,
)
from tessera.core.errors import InvalidRequestError
from tessera.core.placement.base import Placer
from tessera.core.queueing.quotas import Admission, QuotaLedger
from tessera.core.queueing.resources import Flavor
from tessera.core.trial import Trial
from tessera.core.workload import Placement


class ResizingStep(Protocol):
    """What the resizes read and change of their step (``core.step.QuotaStep``)."""

    trial: Trial  # the state and the step's ledger, with the undo log
    running: dict[str, RunningWorkload]
    implicit: bool  # no configured queues
    elastic: bool
    config: SchedulerConfig
    placer: Placer
    rng: np.random.Generator
    waiting: dict[str, str]
    changes: int  # binds, preemptions and shrinks so far (invalidates cached candidates)

    @property
    def ledger(self) -> QuotaLedger: ...

    def place_elastic(
        self, workload: PendingWorkload, flavor: Flavor, fewer: bool = True, within_nominal: bool = False
    ) -> bool: ...


class StepResizes:
    """Shrinks and grows of elastic workloads within one ``QuotaStep``."""

    def __init__(self, step: ResizingStep) -> None:
        self.step = step
        self.shrinks: list[Shrink] = []
        self.queue_of: dict[str, str] = {}  # pending workload id -> queue
        self.quota_waits: set[str] = set()  # pending workloads that wait only for quota (not for capacity)

    def place_over_growth(self, workload: PendingWorkload, flavor: Flavor) -> bool:
        """``_place_elastic`` with the workers that elastic workloads of its queue grew above their gang counted as
        free (growth only took capacity nobody waited for, so it must not change where a later workload goes): the
        grown workers the placement or the quota then needs are given back (``Shrink``), the others stay."""
        step = self.step
        grown = grown_workers(step.running.values()) if step.elastic else []
        if not step.implicit:
            grown = [(w, p) for w, p in grown if step.running[w].queue == workload.queue]
        if not grown:
            return step.place_elastic(workload, flavor)
        mark = step.trial.mark(with_ledger=True)
        for workload_id, placement in grown:
            owner = step.running[workload_id]
            step.trial.release(placement)
            step.ledger.release(owner.queue, owner.admission.flavor_key, worker_charge(placement))
        if not step.place_elastic(workload, flavor):
            step.trial.rollback(mark)
            return False
        taken = []
        for workload_id, placement in reversed(grown):  # in the order they were grown
            owner = step.running[workload_id]
            charge = worker_charge(placement)
            kept = step.ledger.can_admit(owner.queue, owner.admission.flavor_key, charge) is not None
            if kept:
                try:
                    step.trial.bind(placement)
                except InvalidRequestError:
                    kept = False
            if kept:
                step.ledger.admit(owner.queue, owner.admission.flavor_key, charge)
            else:
                taken.append((workload_id, placement))
        if taken:
            self.record_shrinks(workload, taken)
        return True

    def shrink_for(self, workload: PendingWorkload, flavor: Flavor) -> bool:
        """Release workers above the minimum of elastic workloads (``core.elastic.shrinkable_workers``: other
        queues' while they borrow the quota this workload takes back, then lower priority of its own queue), one at
        a time with their quota charge, until ``workload`` is admitted and fits (its whole gang first, then, if
        elastic, fewer workers); keep those shrinks if it does, else undo them. True when it was bound."""
        step = self.step
        queue = None if step.implicit else workload.queue
        key = step.ledger.spec(workload.queue).flavor_key(flavor)
        workers = shrinkable_workers(step.running.values(), workload.priority, queue, self.reclaim_queues(workload))
        passes = (False, True) if workload.elastic_min is not None else (False,)  # only called with elastic on
        for fewer in passes if workers else ():
            mark = step.trial.mark(with_ledger=True)
            released: list[tuple[str, Placement]] = []
            reclaiming = False
            for workload_id, placement in workers:
                owner = step.running[workload_id]
                pool = (owner.queue, owner.admission.flavor_key)
                if owner.queue != workload.queue:  # reclaim: only borrowed quota of the same pool
                    if owner.admission.flavor_key != key or step.ledger.borrowed(*pool).is_zero():
                        continue
                    reclaiming = True
                step.trial.release(placement)
                step.ledger.release(*pool, worker_charge(placement))
                released.append((workload_id, placement))
                if step.place_elastic(workload, flavor, fewer, within_nominal=reclaiming):
                    self.record_shrinks(workload, released)
                    return True
            step.trial.rollback(mark)
        return False

    def reclaim_queues(self, workload: PendingWorkload) -> set[str]:
        """Other queues of the workload's cohort whose elastic workloads may shrink to give its nominal quota back
        (only with a preemption policy that reclaims)."""
        step = self.step
        policy = step.config.preemption
        cohort = step.ledger.spec(workload.queue).cohort
        if step.implicit or policy is None or not policy.reclaim or cohort is None:
            return set()
        return {q.name for q in step.ledger.queues if q.cohort == cohort and q.name != workload.queue}

    def record_shrinks(self, workload: PendingWorkload, released: list[tuple[str, Placement]]) -> None:
        """Record the shrinks that made room for ``workload`` (their charges were released on the ledger)."""
        step = self.step
        by_workload: dict[str, list[Placement]] = {}
        for workload_id, placement in released:
            by_workload.setdefault(workload_id, []).append(placement)
        for workload_id, placements in by_workload.items():
            running = step.running[workload_id]
            kept = list(running.placements)
            for placement in placements:
                kept.remove(placement)
            admission, given = shrunk_admission(running.admission, placements_charge(placements))
            step.running[workload_id] = dataclasses.replace(running, placements=tuple(kept), admission=admission)
            charge = None if step.implicit else given
            self.shrinks.append(Shrink(workload_id, tuple(placements), workload.workload_id, charge))
        step.changes += 1

    def grow(self) -> list[Grow]:
        """Grow running elastic workloads (not shrunk in this step) into the capacity left idle, each worker admitted
        by its queue's quota like a new workload (borrowing only when the workload is preemptible). Nothing grows
        while a workload waits for capacity; a workload waiting only for quota stops growth in its cohort (or its
        queue, without a cohort)."""
        step = self.step
        if any(w not in self.quota_waits for w in step.waiting):
            return []
        held = {self.queue_of.get(w, "") for w in step.waiting}
        held_cohorts = {c for c in (step.ledger.spec(q).cohort for q in held if q) if c is not None}
        shrunk = {s.workload_id for s in self.shrinks}
        growable = [
            r
            for r in step.running.values()
            if r.workload_id not in shrunk
            and r.queue not in held
            and step.ledger.spec(r.queue).cohort not in held_cohorts
        ]
        added: dict[str, Admission] = {}

        def admits(r: RunningWorkload) -> bool:
            admission = step.ledger.can_admit(r.queue, r.admission.flavor_key, worker_charge(r.placements[0]))
            return admission is not None and (r.preemptible or not admission.is_borrowing)

        def bind(r: RunningWorkload, placement: Placement) -> None:
            step.trial.bind(placement)
            admission = step.ledger.admit(r.queue, r.admission.flavor_key, worker_charge(placement))
            before = added.get(r.workload_id)
            added[r.workload_id] = admission if before is None else grown_admission(before, admission)

        grows = grow_into_idle(step.placer, step.rng, growable, bind, admits)
        if step.implicit:
            return grows
        return [dataclasses.replace(g, admission=added[g.workload_id]) for g in grows]
