"""Elastic jobs in the timeline simulator (``TimelinePolicy.elastic``, on for ``tessera`` only; the baselines replay
elastic jobs as rigid gangs).

A job with ``work_steps`` and an elastic range (``TimelineJob.elastic_min`` / ``elastic_max``) is handed to the
scheduler as elastic (``PendingWorkload.elastic_min``, ``RunningWorkload.elastic_min`` / ``elastic_max`` / ``gang``);
a job of fixed duration (``duration_s``, e.g. openb pods, and the ``tenants`` workload's training jobs) never is,
except under the reference policy ``tessera-elastic-durations`` (``elastic_bounds``). An elastic job may start with
fewer workers than its gang, give workers back (``StepPlan.shrinks``) and grow (``StepPlan.grows``); the replay
applies shrinks, then preemptions, then binds, then grows. A grow is applied only when the step saw what every
pending job waits for (the first job of each request shape was in it and still waits), since a grow may take only
capacity nobody waits for; with nothing pending, a step is planned for growth alone.

**Runtime follows the worker count.** The reference runtime (``work_steps / throughput``) is calibrated for the
whole gang; with ``w`` of ``g`` workers a job progresses at ``w / g`` of that speed (linear scaling, no resize
overhead: the workers keep their state). The replay's ``Progress`` of the job (``sim/timeline_progress.py``) keeps
the seconds it would still need with its whole gang; at each resize the work done since the last one is subtracted
and the departure is rescheduled (``RunClock.retime``: the old depart event is made stale with a new run token, as a
preemption does). A preempted, checkpointed job keeps the share of its work still to do.

Every resize also keeps the replay's books: the cluster state and the allocation integral (the added or removed
workers), the queue's quota charge (``Scheduler.release(shrink.admission)``, ``Scheduler.charge(grow)``, and the
running workload's ``Admission``), per-queue received GPU (``QueueAccounts.received_milli``), and LAS attained
service (service so far is folded in at the old worker count, and threshold rechecks are rescheduled).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING

from tessera.core.elastic import grown_admission, placements_charge, shrunk_admission
from tessera.core.invariants import InvariantViolation
from tessera.core.queueing import QuotaLedger, ResourceVector
from tessera.core.queueing.quotas import Admission
from tessera.core.scheduler import Grow, RunningWorkload, Shrink
from tessera.core.workload import Placement
from tessera.sim.timeline_policies import TimelinePolicy
from tessera.sim.timeline_result import TimelineJobLike

if TYPE_CHECKING:
    from tessera.sim.timeline import _Replay


def elastic_bounds(job: TimelineJobLike, policy: TimelinePolicy) -> tuple[int | None, int | None]:
    """``(elastic_min, elastic_max)`` the scheduler sees for ``job``: its range when the policy runs elastic jobs and
    the job runs ``work_steps`` (a fixed-duration job is never elastic: a trace's duration is not work that more
    workers would do faster), else ``(None, None)``. The reference policy ``tessera-elastic-durations``
    (``TimelinePolicy.elastic_fixed_durations``) also takes a fixed duration with an elastic range as the runtime
    with the whole gang."""
    if not policy.elastic or job.work_steps is None and not policy.elastic_fixed_durations:
        return None, None
    low, high = getattr(job, "elastic_min", None), getattr(job, "elastic_max", None)
    if low is None or high is None:
        return None, None
    return int(low), int(high)


class ElasticRuns:
    """The replay's elastic jobs: their progress, and the application of a plan's shrinks and grows."""

    def __init__(self, replay: _Replay) -> None:
        self.replay = replay
        self.shrinks = 0  # workers given back
        self.grows = 0  # workers added

    def growable(self) -> bool:
        """Whether a running, preemptible elastic job is below its maximum (a step with nothing pending may grow
        it; only those that can give workers back grow)."""
        return any(
            r.preemptible and r.elastic_max is not None and len(r.placements) < r.elastic_max
            for r in self.replay.running.values()
        )

    def apply_shrinks(self, now_s: float, shrinks: Sequence[Shrink]) -> None:
        replay = self.replay
        for shrink in shrinks:
            i = int(shrink.workload_id)
            running = replay.running[i]
            for placement in shrink.placements:
                replay.state.release(placement)
                replay.allocated_milli -= placement.total_gpu_milli
            kept, _ = shrunk_admission(running.admission, placements_charge(shrink.placements))
            replay.scheduler.release(shrink.admission)
            left = tuple(p for p in replay.placements[i] if p not in shrink.placements)
            self._resize(now_s, i, left, kept)
            self.shrinks += len(shrink.placements)
            replay.releases += 1  # capacity was freed: shapes that failed may fit now

    def apply_grows(self, now_s: float, grows: Sequence[Grow]) -> None:
        replay = self.replay
        for grow in grows:
            i = int(grow.workload_id)
            running = replay.running[i]
            for placement in grow.placements:
                replay.state.bind(placement)
                replay.allocated_milli += placement.total_gpu_milli
            added = replay.scheduler.charge(grow)
            admission = running.admission if added is None else grown_admission(running.admission, added)
            self._resize(now_s, i, replay.placements[i] + grow.placements, admission)
            self.grows += len(grow.placements)

    def _resize(self, now_s: float, i: int, placements: tuple[Placement, ...], admission: Admission) -> None:
        """Job ``i`` runs on ``placements`` from ``now_s`` (its state and charge already changed): fold its LAS
        service and progress at the old size, account the received GPU, and reschedule its departure and rechecks."""
        replay = self.replay
        before = len(replay.placements[i])
        replay.service.fold(i, now_s, replay._gpus(i))  # LAS: service so far at the old worker count
        replay.placements[i] = placements
        if replay.accounts:
            per_worker = replay.jobs[i].request.total_gpu_milli
            replay.accounts.received_milli[replay._queue(i)] += per_worker * (len(placements) - before)
        replay.running[i] = dataclasses.replace(replay.running[i], placements=placements, admission=admission)
        replay.clock.retime(now_s, i, replay.clock.progress[i].changed(now_s, workers=len(placements)))


def check_charges(ledger: QuotaLedger, running: Sequence[RunningWorkload]) -> None:
    """Raise ``InvariantViolation`` unless every running workload's admission charges exactly its workers and the
    ledger holds exactly the running workloads' charges (a resize that forgot its quota change breaks both)."""
    held: dict[tuple[str, str], ResourceVector] = {}
    for r in running:
        if r.admission.charged != placements_charge(r.placements):
            raise InvariantViolation(f"workload {r.workload_id} is charged {r.admission.charged} for other workers")
        pool = (r.queue, r.admission.flavor_key)
        held[pool] = held.get(pool, ResourceVector.zero()) + r.admission.charged
    for spec in ledger.queues:
        for key in spec.nominal:
            if ledger.usage(spec.name, key) != held.get((spec.name, key), ResourceVector.zero()):
                raise InvariantViolation(f"queue {spec.name} holds {ledger.usage(spec.name, key)} of {key}")
