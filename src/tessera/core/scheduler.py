"""The scheduler: ``plan(pending, now_s) -> StepPlan`` (decisions as data), ``commit(plan, now_s)`` and
``observe(ended, now_s)``, on books it owns (``core.allocation.Allocation``).

One step takes the workloads waiting to run, orders them (priority, then arrival; a queue discipline decides whether
a workload that does not fit blocks those behind it), and places what fits with the configured placement policy.
It never launches anything and never reads a clock. A runtime (the timeline simulator, the control plane) hands the
plan to ``commit``, which applies it to the books in one place (shrinks, preemptions, binds, grows: cluster state,
quota ledger, running table, preemption guard, LAS service), and reports ended workloads with ``observe``; the
simulator adds only physics, the server only durability and effects (plan, store, commit, backend). Placements within
one step are tried on the live ``ClusterState`` and rolled back before ``plan`` returns, so the returned plan is
consistent (no two binds overlap) and the state is left untouched until ``commit``.

Gang workloads (``gang > 1`` workers of the same request) are placed all or nothing. A request that does not fit
leaves a one-line reason in ``StepPlan.waiting`` (shown by ``tessera show`` in the control plane).

**Queues and quotas** (``SchedulerConfig.queues``; without queues the step runs on one implicit queue with an
unlimited quota, ordered by ``SchedulerConfig.discipline``: admission never limits, and a preemption policy, if
given, preempts by priority within it). The scheduler
owns a ``QuotaLedger``. A workload is bound only if ``can_admit(queue, flavor, demand)`` (flavor ``"*"`` unless its
queue has a quota entry for the one GPU model it asks for; demand = GPU milli, CPU and memory of all its workers);
each ``Bind`` carries the ``Admission``. ``commit`` charges it; ``observe`` (or a
preemption) returns it. Queues take turns in weighted DRF order
(lowest dominant share first, recomputed after every bind); within a queue the order is priority then arrival, with
the queue's StrictFIFO or BestEffortFIFO strategy. With ``SchedulerConfig.preemption`` set, a workload that cannot be
admitted (its quota is lent out, or no node fits it) asks ``core.preemption.select_victims`` for running workloads
to stop (reclaim of borrowed capacity across queues, or lower priority within its queue, under the no-loop rule and
``PreemptionGuard``); when stopping them makes the workload fit, the plan holds ``Preempt`` decisions for them and the
workload's ``Bind``. The runtime applies every ``Preempt`` before the binds.

**Elastic workloads** (``SchedulerConfig.elastic``, ``core.elastic``): a running elastic workload gives workers
back (``Shrink``) to higher priority in its queue, or to a queue reclaiming the nominal quota it borrows, before
anything is preempted whole, and grows (``Grow``) into idle capacity its quota admits. With queues both carry the
quota change, which ``commit`` applies with the resize.

**LAS** (``SchedulerConfig.las_thresholds_gpu_s``): the books keep each workload's attained GPU-seconds; ``plan``
turns priorities into LAS levels (pending workloads and, aged to ``now_s``, running ones), and every run is recorded
in the preemption guard when it is bound.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from tessera.core.allocation import UNCHARGED_QUEUE, Allocation, running_of
from tessera.core.cluster import ClusterState
from tessera.core.decisions import (
    Bind,
    Decision,
    Grow,
    PendingWorkload,
    Preempt,
    QueueDiscipline,
    RunningWorkload,
    SchedulerConfig,
    Shrink,
    StepPlan,
)
from tessera.core.demand import demand_of, flavor_of
from tessera.core.placement.base import Learner, Placer
from tessera.core.preemption import PreemptionGuard
from tessera.core.queueing.las import LasService
from tessera.core.queueing.quotas import Admission, QuotaLedger
from tessera.core.step import QuotaStep
from tessera.core.workload import Placement

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
    """Plans a step on one cluster with one placement engine, and applies plans to the books it owns."""

    def __init__(
        self, placer: Placer, config: SchedulerConfig = _DEFAULT_CONFIG, rng: np.random.Generator | None = None
    ) -> None:
        self.placer = placer
        self.config = config
        self.rng = rng if rng is not None else np.random.default_rng(0)  # the step's draws (ties, random placement)
        las = LasService(config.las_thresholds_gpu_s, config.las_within_class) if config.las_thresholds_gpu_s else None
        self.books = Allocation(placer.state, _ledger(config), PreemptionGuard(config.preemption_min_runtime_s), las)
        # Set to a list to record every applied decision with its quota change (the twin-versus-server comparison).
        self.journal: list[Applied] | None = None
        # A placement that learns the workload (``placement.base.Learner``) and the workloads it has been taught.
        self._learner = placer.policy if isinstance(placer.policy, Learner) else None
        self._learnt: set[str] = set()

    @property
    def state(self) -> ClusterState:
        return self.placer.state

    @property
    def ledger(self) -> QuotaLedger | None:
        return self.books.ledger

    # ------------------------------------------------------------------------------------------------ planning

    def plan(
        self,
        pending: Sequence[PendingWorkload],
        now_s: float = 0.0,
        *,
        rng: np.random.Generator | None = None,
        running: Sequence[RunningWorkload] | None = None,
        guard: PreemptionGuard | None = None,
    ) -> StepPlan:
        """One step (module docstring) over ``pending`` as the runtime knows them (priority classes, preemptible and
        checkpointed as asked): the scheduler applies its LAS levels and the policy's preemptibility rule. Running
        workloads, guard and generator are the books' own; ``running``, ``guard`` and ``rng`` replace them for a
        what-if step (a probe, a test) that is not committed. Binds carry the pending workload they bind."""
        by_id = {w.workload_id: w for w in pending}
        self._teach(pending)
        effective = [self.effective(w, now_s) for w in pending]
        if running is None:
            running = self.books.candidates(now_s) if self._reads_running() else ()
        step_guard = guard if guard is not None else self.books.guard
        ledger = self.ledger.copy() if self.ledger is not None else None
        step = QuotaStep(self.placer, self.config, ledger, rng or self.rng, running, now_s, step_guard)
        plan = step.run(effective)
        binds = tuple(dataclasses.replace(b, workload=by_id[b.workload_id]) for b in plan.binds)
        return dataclasses.replace(plan, binds=binds)

    def _teach(self, workloads: Iterable[PendingWorkload]) -> None:
        """Hand a learning placement each worker of the workloads it has not been taught yet (``Learner``)."""
        if self._learner is None:
            return
        for workload in workloads:
            if workload.workload_id not in self._learnt:
                self._learnt.add(workload.workload_id)
                for _ in range(workload.gang):
                    self._learner.learn(workload.request)

    def effective(self, workload: PendingWorkload, now_s: float) -> PendingWorkload:
        """``workload`` as the step sees it: its LAS priority at ``now_s`` and the policy's preemptibility."""
        preemptible = self.preemptible(workload)
        priority = workload.priority
        las = self.books.las
        if las is not None:
            priority = las.priority(workload.workload_id, now_s, 0.0, workload.priority, workload.preemptible)
        if preemptible == workload.preemptible and priority == workload.priority:
            return workload
        return dataclasses.replace(workload, priority=priority, preemptible=preemptible)

    def preemptible(self, workload: PendingWorkload) -> bool:
        """Whether the policy may preempt ``workload``: as it asks, except under LAS, where a preempted run must
        resume from a checkpoint (plain LAS suspends any such workload, whatever it asked; LAS within classes only
        preemptible ones)."""
        if not self.config.las_thresholds_gpu_s:
            return workload.preemptible
        if not self.config.las_within_class:
            return self.checkpointed(workload)
        return workload.preemptible and self.checkpointed(workload)

    def checkpointed(self, workload: PendingWorkload) -> bool:
        return self.config.assume_checkpoints or workload.checkpointed

    def _reads_running(self) -> bool:
        """Whether a step looks at running workloads at all (victims, resizes, expected ends)."""
        config = self.config
        return config.preemption is not None or config.elastic or config.head_reservation

    # ------------------------------------------------------------------------------------------------ applying

    def commit(self, plan: StepPlan, now_s: float, on_applied: AppliedHook | None = None) -> None:
        """Apply ``plan`` to the books: shrinks, then preemptions, then binds, then grows, with their quota charges,
        the preemption guard and LAS service. The plan must come from ``plan`` on these books, unchanged since (a
        runtime may drop the grows it does not apply). ``on_applied(decision, entry)`` runs after each decision with
        the workload's running entry as it is now (for a preemption: as it was), so that a runtime can follow each
        one (the simulator's physics)."""
        books = self.books

        def applied(decision: Decision, entry: RunningWorkload, admission: Admission | None) -> None:
            if self.journal is not None:
                charged = None if admission is None or admission.queue == UNCHARGED_QUEUE else admission
                self.journal.append(Applied(now_s, decision, charged))
            if on_applied is not None:
                on_applied(decision, entry)

        for shrink in plan.shrinks:
            books.shrink(shrink, now_s)
            applied(shrink, books.running[shrink.workload_id], shrink.admission)
        for preempt in plan.preempts:
            victim = books.preempt(preempt, now_s)
            applied(preempt, victim, victim.admission)
        for bind in plan.binds:
            workload = bind.workload
            if workload is None:
                raise ValueError(f"bind of {bind.workload_id} names no pending workload: plan it with Scheduler.plan")
            books.bind(bind, self._entry(workload, bind.placements, now_s), workload.preemptible)
            entry = books.running[bind.workload_id]
            applied(bind, entry, entry.admission)
        for grow in plan.grows:
            books.grow(grow, now_s)
            applied(grow, books.running[grow.workload_id], grow.admission)

    def observe(self, ended: Iterable[str], now_s: float, *, finished: bool = True) -> None:
        """Workloads that stopped outside a plan: those still running give back their capacity, quota and LAS
        service. ``finished``: they are done, so the guard forgets them; False: they will run again (a restart)."""
        ended = list(ended)
        for workload_id in ended:
            if workload_id in self.books.running:
                self.books.remove(workload_id, now_s)
        if finished:
            self.books.guard = self.books.guard.forget(ended)
            self._learnt.difference_update(ended)

    def adopt(
        self,
        workload: PendingWorkload,
        placements: tuple[Placement, ...],
        admission: Admission | None,
        started_s: float,
    ) -> bool:
        """Take a workload that already runs on ``placements`` into the books (a restarted server rebuilding them):
        bound on the state, its ``admission`` charged again (uncharged when None or when its queue's quota no longer
        admits it). False, with nothing changed, when the placements no longer fit the cluster."""
        running = self._entry(workload, placements, started_s)
        if admission is not None:
            running = dataclasses.replace(running, admission=admission)
        self._teach((workload,))  # a restarted server's placement learns again what runs
        return self.books.adopt(running, workload.preemptible)

    def restore(self, victim: RunningWorkload, workload: PendingWorkload, now_s: float) -> bool:
        """Put back a workload that ``commit`` preempted at ``now_s`` when the runtime could not carry the preemption
        out (its decisions were not stored): ``victim`` is its entry as ``on_applied`` was handed it, ``workload`` the
        workload as the runtime knows it (whether it asked to be preemptible). It holds its placements and quota again
        and its LAS service is unchanged; the preemption guard is the runtime's to restore. False, with nothing
        changed, when the placements no longer fit the cluster."""
        return self.books.restore(victim, workload.preemptible, now_s)

    def _entry(self, workload: PendingWorkload, placements: tuple[Placement, ...], started_s: float) -> RunningWorkload:
        """The running entry of ``workload`` on ``placements`` from ``started_s``, with the policy's preemptibility
        and checkpointing (its admission is set by the books)."""
        return running_of(
            workload,
            placements,
            started_s,
            preemptible=self.preemptible(workload),
            checkpointed=self.checkpointed(workload),
            elastic=self.config.elastic,
        )

    def reconfigure(self, config: SchedulerConfig) -> None:
        """New queues or policy options (the server's queues changed): a new ledger, charged with every running
        workload's admission again; one its quota no longer admits keeps running, uncharged."""
        self.config = config
        self.books.ledger = _ledger(config)
        for workload_id in list(self.books.running):
            self.books.recharge(workload_id)

    # ------------------------------------------------------------------------------------- low level and probes

    def charge(self, bind: Bind | Grow) -> Admission | None:
        """Charge a bind or grow applied outside ``commit`` (a what-if test keeping its own books); the admission
        to keep until ``release`` (None: no queues)."""
        if self.ledger is None or bind.admission is None:
            return None
        admission = bind.admission
        return self.ledger.admit(admission.queue, admission.flavor_key, admission.charged)

    def release(self, admission: Admission | None) -> None:
        """Return a quota charged with ``charge`` (or a shrink's ``Shrink.admission``)."""
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
        running: Sequence[RunningWorkload],
        now_s: float,
    ) -> bool:
        """True when ``workload`` is blocked by borrowers and a step planning it alone (against ``running``, not
        committed) would bind it: borrowed capacity is all that keeps it waiting. Seen after a runtime's steps, it
        means a reclaim that should have happened did not."""
        if not self.blocked_by_borrowers(workload):
            return False
        return bool(self.plan([workload], now_s, rng=rng, running=running).binds)


AppliedHook = Callable[[Decision, RunningWorkload], None]


@dataclass(frozen=True, slots=True)
class Applied:
    """One decision as ``Scheduler.commit`` applied it (``Scheduler.journal``)."""

    time_s: float
    decision: Decision
    # The quota it moved: charged by a bind or grow, returned by a preemption or shrink (None: no ledger holds it).
    admission: Admission | None


def _ledger(config: SchedulerConfig) -> QuotaLedger | None:
    return QuotaLedger(config.queues) if config.queues else None
