"""The scheduling step: ``Scheduler.plan(pending, running, now_s) -> StepPlan``, decisions as data.

One step takes the workloads waiting to run, orders them (priority, then arrival; a queue discipline decides whether
a workload that does not fit blocks those behind it), and places what fits with the configured placement policy.
It never launches anything and never reads a clock: the simulator and the control plane apply the ``Bind`` and
``Preempt`` decisions themselves (``ClusterState.bind`` / ``release``) and call ``plan`` again after the next event.
Placements within one step are tried on the live ``ClusterState`` and rolled back before ``plan`` returns, so the
returned plan is consistent (no two binds overlap) and the state is left untouched.

Gang workloads (``gang > 1`` workers of the same request) are placed all or nothing. A request that does not fit
leaves a one-line reason in ``StepPlan.waiting`` (shown by ``tessera show`` in the control plane).

**Queues and quotas** (``SchedulerConfig.queues``; without queues the step runs on one implicit queue with an
unlimited quota, ordered by ``SchedulerConfig.discipline``: admission never limits, and a preemption policy, if
given, preempts by priority within it). The scheduler
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

**Elastic workloads** (``SchedulerConfig.elastic``, ``core.elastic``): a running elastic workload gives workers
back (``Shrink``) to higher priority in its queue, or to a queue reclaiming the nominal quota it borrows, before
anything is preempted whole, and grows (``Grow``) into idle capacity its quota admits. With queues both carry the
quota change: ``release(shrink.admission)``, ``charge(grow)``. The runtime applies shrinks, then preempts, then
binds, then grows.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tessera.core.cluster import ClusterState
from tessera.core.decisions import (
    Bind,
    Grow,
    PendingWorkload,
    Preempt,
    QueueDiscipline,
    RunningWorkload,
    SchedulerConfig,
    Shrink,
    StepPlan,
)
from tessera.core.placement.base import Placer
from tessera.core.preemption import PreemptionGuard
from tessera.core.queueing.quotas import Admission, QuotaLedger
from tessera.core.step import QuotaStep, demand_of, flavor_of

__all__ = [
    "Bind",
    "Grow",
    "PendingWorkload",
    "Preempt",
    "QueueDiscipline",
    "RunningWorkload",
    "Scheduler",
    "SchedulerConfig",
    "Shrink",
    "StepPlan",
]


_DEFAULT_CONFIG = SchedulerConfig()


class Scheduler:
    """Plans binds (and, with a preemption policy, preemptions) on one cluster with one placement engine."""

    def __init__(self, placer: Placer, config: SchedulerConfig = _DEFAULT_CONFIG) -> None:
        self.placer = placer
        self.config = config
        self.ledger: QuotaLedger | None = QuotaLedger(config.queues) if config.queues else None

    @property
    def state(self) -> ClusterState:
        return self.placer.state

    def charge(self, bind: Bind | Grow) -> Admission | None:
        """Charge an applied bind (or an elastic workload's grow) to its queue's quota; the admission to keep until
        ``release`` (None: no queues). Shrinks and preemptions of the same plan must be applied first (releasing can
        only make room). A grow's admission is added to the workload's own (``core.elastic.grown_admission``)."""
        if self.ledger is None or bind.admission is None:
            return None
        admission = bind.admission
        return self.ledger.admit(admission.queue, admission.flavor_key, admission.charged)

    def release(self, admission: Admission | None) -> None:
        """Return the quota of a workload that stopped (finished or preempted), or a shrink's ``Shrink.admission``
        (the workload keeps ``core.elastic.shrunk_admission``)."""
        if self.ledger is not None and admission is not None:
            self.ledger.release(admission.queue, admission.flavor_key, admission.charged)

    def blocked_by_borrowers(self, workload: PendingWorkload) -> bool:
        """True when the workload fits within its queue's unused nominal quota but cannot be admitted: other queues
        borrow that quota (what reclaim exists for; a runtime measures how long this lasts)."""
        if self.ledger is None:
            return False
        flavor = flavor_of(self.ledger.spec(workload.queue), workload.request)
        demand = demand_of(workload)
        return self.ledger.fits_within_nominal(workload.queue, flavor, demand) and (
            self.ledger.can_admit(workload.queue, flavor, demand) is None
        )

    def reclaim_would_admit(
        self,
        workload: PendingWorkload,
        rng: np.random.Generator,
        running: Sequence[RunningWorkload] = (),
        now_s: float = 0.0,
        guard: PreemptionGuard | None = None,
    ) -> bool:
        """True when ``workload`` is blocked by borrowers and a step planning it alone would bind it (stopping the
        borrowers, and whatever else the preemption policy allows): borrowed capacity is all that keeps it waiting.
        Seen after a runtime's steps, it means a reclaim that should have happened did not."""
        return self.blocked_by_borrowers(workload) and bool(self.plan([workload], rng, running, now_s, guard).binds)

    def plan(
        self,
        pending: Sequence[PendingWorkload],
        rng: np.random.Generator,
        running: Sequence[RunningWorkload] = (),
        now_s: float = 0.0,
        guard: PreemptionGuard | None = None,
    ) -> StepPlan:
        """One step (module docstring). ``running`` (preemption candidates; with ``head_reservation`` also their
        expected ends), ``now_s`` and ``guard`` matter only with a preemption policy or head reservation. Without
        configured queues every workload is in one implicit, unlimited queue and the binds carry no admission."""
        ledger = self.ledger.copy() if self.ledger is not None else None
        return QuotaStep(self.placer, self.config, ledger, rng, running, now_s, guard).run(pending)
