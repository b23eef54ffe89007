"""The books a scheduling plan is applied to: one object, one place where binds, preemptions and resizes change them.

``Allocation`` holds the cluster state (per-GPU free vectors), the quota ledger (None without queues), the running
workloads (``RunningWorkload`` by id), the ``PreemptionGuard`` and, for LAS policies, the attained service
(``LasService``). ``Scheduler.commit`` applies a ``StepPlan`` here (shrinks, then preemptions, then binds, then
grows) and ``Scheduler.observe`` the workloads that ended; the timeline simulator and the control plane both go
through them, so the digital twin and the live system keep their books the same way. Runtimes read the books
(``running``, ``placements``) and add only what is theirs: physics (progress, departures) in the simulator,
durability and processes in the server.

Pure: no clock (``now_s`` comes in), no I/O.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator

from tessera.core.cluster import ClusterState
from tessera.core.decisions import Bind, Grow, PendingWorkload, Preempt, RunningWorkload, Shrink
from tessera.core.elastic import grown_admission, placements_charge, shrunk_admission
from tessera.core.errors import InvalidRequestError
from tessera.core.preemption import PreemptionGuard
from tessera.core.queueing.las import LasService
from tessera.core.queueing.quotas import Admission, QuotaLedger
from tessera.core.queueing.resources import ANY_FLAVOR, ResourceVector
from tessera.core.workload import MILLI_PER_GPU, Placement

UNCHARGED_QUEUE = "(uncharged)"  # the queue label of an admission no ledger holds (no queues, or a quota cut)


def gpus_held(placements: Iterable[Placement]) -> float:
    """GPUs that ``placements`` hold, as requested (LAS counts service in these)."""
    return sum(p.request.total_gpu_milli for p in placements) / MILLI_PER_GPU


class Allocation:
    """Cluster state, quota ledger, running table, preemption guard and LAS service of one scheduler."""

    def __init__(
        self,
        state: ClusterState,
        ledger: QuotaLedger | None,
        guard: PreemptionGuard,
        las: LasService | None = None,
    ) -> None:
        self.state = state
        self.ledger = ledger
        self.guard = guard
        self.las = las
        self.running: dict[str, RunningWorkload] = {}
        # Running workloads the ledger does not hold (no queues, or re-admission failed after a quota cut): their
        # admission is a label only, never released, and they are no preemption candidates.
        self.uncharged: set[str] = set()
        # Running workloads being stopped outside a plan (cancel, watchdog): they hold capacity until they end, but
        # no step may choose them as victims or resize them.
        self.stopping: set[str] = set()
        # Running, LAS within classes: whether each asked to be preemptible (its entry's ``preemptible`` is the
        # policy's verdict, which also needs a checkpoint).
        self._asked_preemptible: dict[str, bool] = {}
        # LAS: each running entry aged to a time, kept while neither changes (the steps of one instant reuse it).
        self._aged: dict[str, tuple[float, RunningWorkload, RunningWorkload]] = {}

    # ------------------------------------------------------------------------------------------------ reading

    def placements(self) -> Iterator[Placement]:
        """Every placement of every running workload."""
        for r in self.running.values():
            yield from r.placements

    def candidates(self, now_s: float) -> list[RunningWorkload]:
        """What a step may preempt or resize: running workloads, charged and not being stopped, with LAS priorities
        aged to ``now_s``."""
        excluded = self.uncharged | self.stopping
        running = [r for wid, r in self.running.items() if wid not in excluded]
        if self.las is None:
            return running
        return [self._aged_to(r, now_s) for r in running]

    def _aged_to(self, r: RunningWorkload, now_s: float) -> RunningWorkload:
        cached = self._aged.get(r.workload_id)
        if cached is not None and cached[0] == now_s and cached[1] is r:
            return cached[2]
        aged = dataclasses.replace(r, priority=self.las_priority(r, now_s))
        self._aged[r.workload_id] = (now_s, r, aged)
        return aged

    def las_priority(self, r: RunningWorkload, now_s: float) -> int:
        assert self.las is not None
        asked = self._asked_preemptible[r.workload_id]
        return self.las.priority(r.workload_id, now_s, gpus_held(r.placements), r.priority, asked)

    # ----------------------------------------------------------------------------------------------- applying

    def shrink(self, shrink: Shrink, now_s: float) -> None:
        running = self.running[shrink.workload_id]
        self._fold(running, now_s)
        for placement in shrink.placements:
            self.state.release(placement)
        kept, _ = shrunk_admission(running.admission, placements_charge(shrink.placements))
        self._release(shrink.admission)
        left = tuple(p for p in running.placements if p not in shrink.placements)
        self.running[shrink.workload_id] = dataclasses.replace(running, placements=left, admission=kept)

    def preempt(self, preempt: Preempt, now_s: float) -> RunningWorkload:
        """Stop a running workload for another: its capacity and quota are released and the guard protects its
        next run."""
        victim = self.remove(preempt.workload_id, now_s)
        self.guard = self.guard.record([preempt.workload_id])
        return victim

    def bind(self, bind: Bind, running: RunningWorkload, asked_preemptible: bool) -> None:
        """Start ``running`` on the bind's placements, charged with its admission; under LAS its service starts and
        the guard protects the run for its first minimum run time."""
        for placement in bind.placements:
            self.state.bind(placement)
        self.running[bind.workload_id] = running
        if bind.admission is None or self.ledger is None:
            self.uncharged.add(bind.workload_id)
        else:
            admission = bind.admission
            charged = self.ledger.admit(admission.queue, admission.flavor_key, admission.charged)
            self.running[bind.workload_id] = dataclasses.replace(running, admission=charged)
        self._start_service(running, asked_preemptible)
        if self.las is not None:
            self.guard = self.guard.record([bind.workload_id])

    def grow(self, grow: Grow, now_s: float) -> None:
        running = self.running[grow.workload_id]
        self._fold(running, now_s)
        for placement in grow.placements:
            self.state.bind(placement)
        admission = running.admission
        if grow.admission is not None and self.ledger is not None:
            added = self.ledger.admit(grow.admission.queue, grow.admission.flavor_key, grow.admission.charged)
            admission = grown_admission(admission, added)
        placements = running.placements + grow.placements
        self.running[grow.workload_id] = dataclasses.replace(running, placements=placements, admission=admission)

    def remove(self, workload_id: str, now_s: float) -> RunningWorkload:
        """Release a running workload's placements and quota and stop its LAS service."""
        running = self.running.pop(workload_id)
        if self.las is not None:
            self.las.stop(workload_id, now_s, gpus_held(running.placements))
        for placement in running.placements:
            self.state.release(placement)
        if workload_id not in self.uncharged:
            self._release(running.admission)
        self.uncharged.discard(workload_id)
        self.stopping.discard(workload_id)
        self._asked_preemptible.pop(workload_id, None)
        self._aged.pop(workload_id, None)
        return running

    def set_expected_end(self, workload_id: str, end_s: float) -> None:
        """A runtime's estimate of when a running workload ends (head reservation reads it)."""
        running = self.running.get(workload_id)
        if running is not None:
            self.running[workload_id] = dataclasses.replace(running, expected_end_s=end_s)

    def adopt(self, running: RunningWorkload, asked_preemptible: bool) -> bool:
        """Take a workload that already runs into the books (a restarted server): bind its placements, charge its
        admission (when its queue's quota no longer admits it, it keeps running uncharged) and, under LAS, count
        its service from its start. False, with nothing changed, when its placements do not fit the state."""
        bound: list[Placement] = []
        try:
            for placement in running.placements:
                self.state.bind(placement)
                bound.append(placement)
        except InvalidRequestError:
            for placement in reversed(bound):
                self.state.release(placement)
            return False
        self.running[running.workload_id] = running
        self.recharge(running.workload_id)
        self._start_service(running, asked_preemptible)
        return True

    def restore(self, victim: RunningWorkload, asked_preemptible: bool, now_s: float) -> bool:
        """Undo the preemption of ``victim`` (its entry as ``preempt`` returned it) at ``now_s``, when the runtime
        could not carry it out: bound again on its placements, its admission charged again (uncharged when its quota
        no longer admits it). Under LAS its run goes on from ``now_s``: ``preempt`` already counted its service up to
        then (its start stays, for the runtime's rechecks). The guard is the runtime's to restore. False, with nothing
        changed, when its placements no longer fit."""
        if not self.adopt(victim, asked_preemptible):
            return False
        if self.las is not None:
            self.las.start(victim.workload_id, now_s)
        return True

    def recharge(self, workload_id: str) -> bool:
        """Charge a running workload's admission to the current ledger (after the queues changed); False when the
        quota no longer admits it (it keeps running, uncharged)."""
        running = self.running[workload_id]
        admission = running.admission
        self.uncharged.add(workload_id)
        if self.ledger is None or admission.queue == UNCHARGED_QUEUE:
            return False
        try:
            charged = self.ledger.admit(admission.queue, admission.flavor_key, admission.charged)
        except (InvalidRequestError, KeyError):  # over the quota now, or a queue that is gone
            return False
        self.running[workload_id] = dataclasses.replace(running, admission=charged)
        self.uncharged.discard(workload_id)
        return True

    def _start_service(self, running: RunningWorkload, asked_preemptible: bool) -> None:
        if self.las is not None:
            self.las.start(running.workload_id, running.started_s)
            self._asked_preemptible[running.workload_id] = asked_preemptible

    def _fold(self, running: RunningWorkload, now_s: float) -> None:
        if self.las is not None:  # LAS: service so far at the old worker count
            self.las.fold(running.workload_id, now_s, gpus_held(running.placements))

    def _release(self, admission: Admission | None) -> None:
        if self.ledger is not None and admission is not None:
            self.ledger.release(admission.queue, admission.flavor_key, admission.charged)


def uncharged_admission(placements: tuple[Placement, ...]) -> Admission:
    """The admission label of a workload no ledger charges (its charge computed from its workers)."""
    return Admission(UNCHARGED_QUEUE, ANY_FLAVOR, placements_charge(placements), ResourceVector.zero())


def running_of(
    workload: PendingWorkload,
    placements: tuple[Placement, ...],
    now_s: float,
    *,
    preemptible: bool,
    checkpointed: bool,
    elastic: bool,
) -> RunningWorkload:
    """The running entry of a pending workload bound on ``placements`` at ``now_s`` (admission set by the books)."""
    low, high = (workload.elastic_min, workload.elastic_max) if elastic else (None, None)
    return RunningWorkload(
        workload.workload_id,
        workload.queue,
        workload.priority,
        placements,
        uncharged_admission(placements),
        now_s,
        preemptible,
        checkpointed,
        elastic_min=low,
        elastic_max=high,
        gang=workload.gang if low is not None else None,
    )
