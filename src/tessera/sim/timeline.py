"""The timeline simulator: workloads arrive, wait, run for their duration and leave, on one scheduling core.

Each event time (arrivals, then departures that free capacity) is followed by scheduling steps of the same
``tessera.core.scheduler.Scheduler`` the control plane runs, until a step binds nothing. Pending workloads are kept
grouped by request shape: within a step a shape that did not fit is not retried, and after a failure it is retried
only once capacity has been released since (binds alone never make a failed request fit).

Baselines are configurations of that one scheduler (``TIMELINE_POLICIES``):

- ``static``: whole GPUs per workload (a fractional request takes a whole GPU), strict FIFO, no sharing: the static
  binding Tessera replaces;
- ``fifo-share``: fractional GPUs, strict FIFO, best-fit placement;
- ``tiresias``: discretised two-dimensional LAS (Tiresias, NSDI '19): whole GPUs, best-fit placement, no sharing.
  A job's priority is its LAS queue (``core.queueing.las``): attained service = GPUs × seconds run, thresholds
  ``TIRESIAS_THRESHOLDS_GPU_S`` = 1 and 10 GPU-hours (three queues), less service first, FIFO within a queue,
  with backfill. The scheduler's ordinary within-queue preemption by priority does the rest: a waiting job that
  does not fit preempts running jobs of lower LAS queues (``core.preemption.select_victims``: fewest, then youngest
  victims; ``Preempt`` decisions). Without tenant queues the replay gives the scheduler one queue whose quota is
  the whole cluster (``las_queues``) so that the quota-aware, preempting step runs. Every run is recorded in the
  ``PreemptionGuard`` when it starts, so no job is preempted before it has run ``PREEMPTION_MIN_RUNTIME_S``
  (against thrashing). Running jobs' priorities are recomputed at each step, and a ``recheck`` event at each
  threshold crossing and each guard expiry triggers a step. As in the paper, preemption suspends a job to its
  checkpoint and resumes it later (remaining work kept, no restart overhead), whatever its priority class; a job
  the workload marks as unable to checkpoint is therefore never preempted (preempting it would restart it from
  zero, which measured worse: openb 7.67 h against 7.22 h average JCT). The reference policy
  ``tiresias-all-checkpointed`` instead assumes every job can checkpoint, as the paper does; it is not physically
  consistent on workloads with jobs that cannot. Simplified: no Gittins-index variant, no
  starvation promotion, no consolidation beyond best-fit; victims are chosen by the no-loop rule's cost (fewest,
  youngest), not strictly from the lowest queue first;
- ``gavel``: heterogeneity-aware scheduling after Gavel (OSDI '20), simplified: whole GPUs, no sharing, no
  preemption, backfill, and ``hetero`` placement (the GPU type on which the job type runs fastest, from the
  throughput model; best-fit among equally fast ones and for requests without a job type). Gavel solves a max-min
  fairness program over normalized effective throughput and time-shares GPUs in rounds (leases of ~6 min, with
  preemption); here there are no rounds, so every waiting job has received a normalized throughput of 0 and the
  max-min order reduces to the ordinary order (priority, then arrival); what remains of Gavel is the
  heterogeneity-aware choice of GPU type (and no space sharing, unlike ``tessera``);
- ``tessera``: fractional GPUs, priority order with backfill (BestEffortFIFO), heterogeneity-aware placement
  (``hetero``: the GPU model on which the job type runs fastest, best-fit among equally fast ones; best-fit for
  requests without a job type). In a cluster where work also leaves, packing beats the fill-up-optimised ``tessera``
  placement: on the openb timeline (scale 0.005) it gave 7.20 h average JCT against 8.40 h, because the ``tessera``
  placement spreads small pods over idle 8-GPU nodes that big pods then wait for. Within a priority class,
  preemptible and checkpointed jobs are ordered by least attained service (LAS, as tiresias) and may be preempted
  for a job of a lower LAS level; services and non-checkpointed jobs are never preempted for that (restarting a job
  from zero to serve a shorter one loses more than it gains). Elastic jobs (``TimelinePolicy.elastic``, tessera
  only: the baselines replay them as rigid gangs; ``sim.timeline_elastic``): a job with ``work_steps`` and an
  elastic range starts with the most workers that fit (at least its minimum), gives workers back instead of being
  preempted whole (grown ones to any pending job of its queue, the others to higher priority or to a queue
  reclaiming its quota) and grows into idle GPUs its quota admits; its runtime follows its worker count (linear
  scaling of the whole-gang runtime). Fixed-duration jobs are never elastic. A typed share joins a GPU only when it
  holds no other typed job or one with which sharing is a net gain (``TimelinePolicy.colocation_rule``,
  ``placement.hetero``). Reference policies: ``tessera-rigid`` (elastic off), ``tessera-elastic-durations`` (fixed
  durations with an elastic range taken as whole-gang runtimes) and ``tessera-any-colocation`` (no co-location rule).

**Physics, the same under every policy.** A running job's speed (``sim.timeline_progress.Progress``) is its
isolated speed on its GPU model times ``workers / gang`` times its co-location factor: with ``colocation`` given,
typed jobs on part of one GPU slow each other as the measured model says (``sim.colocation``), and a change of
partners re-times the jobs on that GPU. A preempted, checkpointed job resumes with the share of its work still to do,
at the speed of the GPU model it restarts on; one without a checkpoint restarts from zero.

**Queues** (``run_timeline(..., queues=...)``, the ``tenants`` workload): the scheduler admits against the queues'
quotas. ``tessera`` lets queues of a cohort borrow idle quota and takes it back by preemption (reclaim; also lower
priority within a queue); ``static`` and ``fifo-share`` keep every queue within its nominal quota (no cohort, no
borrowing, no preemption, StrictFIFO per queue); ``gavel`` does the same with BestEffortFIFO, and ``tiresias`` too
but with LAS priorities and preemption within each queue. A preempted job returns to pending with its remaining work
when checkpointed, else from the start. An elastic job's grow
is charged to its queue's quota like a new job (borrowing only in a cohort), and a shrink returns its charge,
borrowed part first. Per queue the replay integrates, over the times the queue has pending or
running demand, the GPU it received and its entitlement (``core.queueing.fairshare.entitlement`` of the original
quotas, so every policy is judged against the same promise); ``queue_shares`` is received / entitled, ``jain_index``
Jain's index over those shares. ``reclaim_latency_max_s`` measures "borrowed capacity is returned within one
scheduling step": after each instant's steps, a queue is *blocked by borrowers* while one of its pending workloads
fits within its unused nominal quota but cannot be admitted (``Scheduler.blocked_by_borrowers``) and a step planning
it alone would bind it (``Scheduler.reclaim_would_admit``); the longest such stretch is reported (0 when every
reclaim that lets the owner run happens in the step where the owner's demand appears). ``blocked_by_borrowers_max_s``
is the longest stretch of the first condition alone (``tessera.sim.timeline_reclaim``).

Called by ``tessera simulate timeline`` and the benchmarks; what it reads and returns is in
``tessera.sim.timeline_result``.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Sequence

import numpy as np

from tessera.core.cluster import ClusterState, NodeSpec
from tessera.core.fragmentation import typical_pods
from tessera.core.invariants import check_cluster, check_quotas
from tessera.core.placement import Placer, make_policy
from tessera.core.preemption import PreemptionGuard, PreemptionPolicy
from tessera.core.queueing import QueueSpec
from tessera.core.scheduler import (
    Bind,
    PendingWorkload,
    Preempt,
    QueueDiscipline,
    RunningWorkload,
    Scheduler,
    SchedulerConfig,
)
from tessera.core.throughput import ColocationModel, ThroughputModel
from tessera.core.workload import MILLI_PER_GPU, Placement, Request
from tessera.sim.events import EventLoop
from tessera.sim.timeline_accounts import QueueAccounts, jain_index
from tessera.sim.timeline_elastic import ElasticRuns, check_charges, elastic_bounds
from tessera.sim.timeline_las import LasService
from tessera.sim.timeline_pending import PendingJobs, Shape
from tessera.sim.timeline_policies import (
    LAS_QUEUE,
    PREEMPTION_MIN_RUNTIME_S,
    TimelinePolicy,
    las_queues,
    policy_queues,
    resolve_policy,
    whole_gpu_request,
)
from tessera.sim.timeline_reclaim import ReclaimTracker
from tessera.sim.timeline_result import StartRecord, TimelineJobLike, TimelineResult
from tessera.sim.timeline_runs import RunClock

__all__ = ["StartRecord", "TimelineJobLike", "TimelineResult", "run_timeline"]


def _typed(request: Request, job: TimelineJobLike) -> Request:
    """The request with the job's type, so that throughput-aware placement can read it."""
    if job.job_type and not request.job_type:
        return dataclasses.replace(request, job_type=job.job_type)
    return request


def run_timeline(
    nodes: Sequence[NodeSpec],
    jobs: Sequence[TimelineJobLike],
    policy_name: str,
    seed: int = 0,
    throughput: ThroughputModel | None = None,
    queues: Sequence[QueueSpec] = (),
    *,
    colocation: ColocationModel | None = None,
    check_invariants: bool = False,
) -> TimelineResult:
    """Replay ``jobs`` on ``nodes`` under one policy; every job either finishes or never fits.

    A job without ``duration_s`` runs ``work_steps / throughput(job_type, model)`` seconds on the GPU model it got.
    With ``queues`` every job's ``queue`` must name one of them (module docstring). ``check_invariants`` (debug
    mode, for tests) checks the cluster and the quota ledger after every step (``core.invariants``).
    """
    policy = resolve_policy(policy_name)
    replay = _Replay(nodes, jobs, policy, seed, throughput or ThroughputModel({}), tuple(queues), colocation)
    replay.check_invariants = check_invariants
    return replay.run()


Event = tuple[str, int, int]  # (kind, job index, run token: a depart or recheck of an earlier, preempted run is stale)


class _Replay:
    def __init__(
        self,
        nodes: Sequence[NodeSpec],
        jobs: Sequence[TimelineJobLike],
        policy: TimelinePolicy,
        seed: int,
        throughput: ThroughputModel,
        queues: tuple[QueueSpec, ...] = (),
        colocation: ColocationModel | None = None,
    ):
        self.policy = policy
        self.rng = np.random.default_rng(seed)
        self.throughput = throughput
        self.jobs = [j for j in jobs if j.duration_s is not None or j.work_steps is not None]
        self.requests = [_typed(whole_gpu_request(j.request) if policy.whole_gpus else j.request, j) for j in self.jobs]
        self.state = ClusterState(sorted(nodes, key=lambda n: n.name))
        typical = typical_pods(self.requests)
        placer = Placer(
            self.state,
            make_policy(
                policy.placement,
                typical,
                self.state.model_names,
                throughput=throughput,
                job_type_of=lambda request: request.job_type or None,
                colocation=colocation if policy.colocation_rule else None,
            ),
        )
        self.las = policy.las_thresholds_gpu_s
        # Without tenant queues, LAS and tessera's priority classes run on one whole-cluster queue, so that the
        # step's within-queue priority preemption applies.
        one_queue = not queues and (bool(self.las) or policy.borrowing)
        scheduler_queues = policy_queues(queues, policy) if queues else las_queues(self.state) if one_queue else ()
        preemption = None
        if queues and policy.borrowing:  # reclaim borrowed quota across queues, and priority within a queue
            preemption = PreemptionPolicy()
        elif self.las or one_queue:  # priority (or LAS level) within a queue, never across queues
            preemption = PreemptionPolicy(within_queue=True, reclaim=False)
        config = SchedulerConfig(
            discipline=policy.discipline,
            queues=scheduler_queues,
            preemption=preemption,
            gang_one_node=policy.gang_one_node,
            head_reservation=policy.head_reservation,
            elastic=policy.elastic,
        )
        self.scheduler = Scheduler(placer, config)
        self.elastic = ElasticRuns(self)
        self.accounts = QueueAccounts(queues, self.state) if queues else None
        self.guard = PreemptionGuard(PREEMPTION_MIN_RUNTIME_S)
        self.start_s = np.full(len(self.jobs), np.nan)
        self.finish_s = np.full(len(self.jobs), np.nan)
        self.placements: dict[int, tuple[Placement, ...]] = {}
        self.starts: list[StartRecord] = []
        self.running: dict[int, RunningWorkload] = {}  # with queues: what preemption may consider
        self.tokens = [0] * len(self.jobs)
        self.clock = RunClock(self, colocation)  # progress, departures, co-location (every policy alike)
        self.loop: EventLoop[Event] = EventLoop()
        self.service = LasService(self.las, policy.las_within_class, len(self.jobs))  # LAS attained service
        strict = policy.discipline is QueueDiscipline.STRICT_FIFO
        self.pending = PendingJobs(strict, self._shape, lambda i: self._queue(i) if self.accounts else "")
        self.releases = 0
        self.preemptions = 0
        self.reclaim = ReclaimTracker(self.scheduler, seed)
        self.check_invariants = False
        self.reclaims = 0
        self.allocated_milli = 0
        self.alloc_integral = 0.0
        self.last_s = 0.0
        self.alloc_times: list[float] = []
        self.alloc_values: list[float] = []

    def run(self) -> TimelineResult:
        started = time.perf_counter()
        loop = self.loop
        order = sorted(range(len(self.jobs)), key=lambda i: (self.jobs[i].arrival_s, self.jobs[i].id))
        for i in order:
            loop.schedule(self.jobs[i].arrival_s, ("arrive", i, 0), priority=1)
        first = self.jobs[order[0]].arrival_s if order else 0.0
        self.last_s = first
        loop.run(lambda now, event: self._handle(loop, now, event))
        done = ~np.isnan(self.finish_s)
        span = max(float(np.nanmax(self.finish_s)) - first, 1e-9) if done.any() else 1e-9
        capacity = self.state.gpu_capacity_milli
        shares = self.accounts.shares() if self.accounts else {}
        return TimelineResult(
            self.policy.name,
            np.array([self.jobs[i].arrival_s for i in np.flatnonzero(done)]),
            self.start_s[done],
            self.finish_s[done],
            100.0 * self.alloc_integral / (span * capacity) if capacity else 0.0,
            int((~done).sum()),
            time.perf_counter() - started,
            np.array(self.alloc_times),
            np.array(self.alloc_values) * 100.0 / max(capacity, 1),
            preemptions=self.preemptions,
            jain_index=jain_index(list(shares.values())),
            queue_shares=shares,
            reclaims=self.reclaims,
            reclaim_latency_max_s=self.reclaim.longest["reclaim_missed"],
            blocked_by_borrowers_max_s=self.reclaim.longest["quota_blocked"],
            starts=tuple(self.starts),
            shrunk_workers=self.elastic.shrinks,
            grown_workers=self.elastic.grows,
        )

    def _handle(self, loop: EventLoop[Event], now: float, event: Event) -> None:
        self._advance(now)
        kind, i, token = event
        if kind == "depart":
            if token == self.tokens[i]:  # else the run it ended was preempted
                self._stop(i)
                self.guard = self.guard.forget([self.jobs[i].id])
                if self.accounts:
                    self.accounts.demand_milli[self._queue(i)] -= self._milli(i)
        elif kind == "recheck":
            if token == self.tokens[i]:  # a running job's LAS queue dropped or its guard expired: retry the waiting
                self.releases += 1
        else:
            self.pending.add(i)
            if self.accounts:
                self.accounts.demand_milli[self._queue(i)] += self._milli(i)
        upcoming = loop.next_time_s()
        if upcoming is None or upcoming > now:  # schedule once all events of this instant are in
            self._schedule(loop, now)
            if self.policy.borrowing and self.accounts:
                blocked = self.reclaim.blocked_queues(self.pending.heads())
                if blocked:  # borrowers took quota after the owner's shapes failed: retry them (reclaim) now
                    self.pending.retry_queues(blocked)
                    self._schedule(loop, now)
                self.reclaim.track(now, self.pending.heads(), self._running_now, self.guard)
            self.alloc_times.append(now)
            self.alloc_values.append(self.allocated_milli)

    def _advance(self, now: float) -> None:
        self.alloc_integral += self.allocated_milli * (now - self.last_s)
        if self.accounts:
            self.accounts.advance(now - self.last_s)
        self.last_s = now

    def _milli(self, i: int) -> int:
        """GPU milli the job asks for, all workers (as requested, before static rounding)."""
        return self.jobs[i].request.total_gpu_milli * self.jobs[i].gang

    def _queue(self, i: int) -> str:
        if not self.accounts:
            return LAS_QUEUE
        return str(getattr(self.jobs[i], "queue", "default"))

    def _gpus(self, i: int) -> float:
        """GPUs the job holds while it runs (as placed: whole GPUs under static rounding), all its workers now (the
        gang when not running)."""
        placed = self.placements.get(i)
        workers = self.jobs[i].gang if placed is None else len(placed)
        return self.requests[i].total_gpu_milli * workers / MILLI_PER_GPU

    def _preemptible(self, job: TimelineJobLike) -> bool:
        """Plain LAS (tiresias) suspends any job that can resume from a checkpoint, whatever its class; LAS within
        classes only preemptible, checkpointed ones (restarting a job from zero to serve a shorter one loses more than
        it gains); otherwise the job's flag."""
        preemptible = bool(getattr(job, "preemptible", False))
        if not self.las:
            return preemptible
        if not self.policy.las_within_class:
            return self._resumes(job)
        return preemptible and self._resumes(job)

    def _resumes(self, job: TimelineJobLike) -> bool:
        """A preempted run of ``job`` resumes from a checkpoint (else it restarts from zero): the workload says so,
        or the policy assumes it for every job (``TimelinePolicy.assume_checkpoints``, a reference only)."""
        return self.policy.assume_checkpoints or bool(getattr(job, "checkpointed", False))

    def _priority(self, i: int, now: float) -> int:
        """The job's priority: its own, or under LAS the one its attained service (so far, at ``now``) gives."""
        job = self.jobs[i]
        if not self.las:
            return job.priority
        return self.service.priority(i, now, self._gpus(i), job.priority, bool(getattr(job, "preemptible", False)))

    def _shape(self, i: int) -> Shape:
        job = self.jobs[i]
        priority = self._priority(i, self.last_s)
        low, _ = elastic_bounds(job, self.policy)
        return (self.requests[i], job.gang, priority, self._queue(i), self._preemptible(job), low)

    def _schedule(self, loop: EventLoop[Event], now: float) -> None:
        while True:
            candidates = self.pending.candidates(self.releases)
            if not candidates:
                if self.pending.no_shapes and self.elastic.growable():  # nothing waits: elastic jobs may grow
                    plan = self.scheduler.plan([], self.rng, self._running_now(), now, self.guard)
                    self.elastic.apply_grows(now, plan.grows)
                    self._check()
                return
            pending = [
                PendingWorkload(
                    str(i),
                    self.requests[i],
                    self.jobs[i].arrival_s,
                    self._priority(i, now),
                    queue=self._queue(i),
                    gang=self.jobs[i].gang,
                    preemptible=self._preemptible(self.jobs[i]),
                    expected_duration_s=self.clock.known_duration(i),
                    elastic_min=elastic_bounds(self.jobs[i], self.policy)[0],
                )
                for i in candidates
            ]
            plan = self.scheduler.plan(pending, self.rng, self._running_now(), now, self.guard)
            self.elastic.apply_shrinks(now, plan.shrinks)
            for preempt in plan.preempts:
                self._preempt(now, preempt)
            for bind in plan.binds:
                self._start(loop, now, bind)
            for job_id in plan.waiting:
                self.pending.failed(int(job_id), self.releases)
            if plan.grows and self.pending.all_waiting_seen(plan.waiting):
                self.elastic.apply_grows(now, plan.grows)
            self._check()
            if not plan.binds:
                return

    def _check(self) -> None:
        """Debug mode (``check_invariants``): the cluster, the quota rules and every running job's charge."""
        if self.check_invariants:
            check_cluster(self.state, [p for placed in self.placements.values() for p in placed])
            if self.scheduler.ledger is not None:
                check_quotas(self.scheduler.ledger)
                check_charges(self.scheduler.ledger, list(self.running.values()))

    def _running_now(self) -> list[RunningWorkload]:
        running = list(self.running.values())
        if self.las:  # running jobs age: their priority is the one their service gives now
            now = self.last_s
            running = [dataclasses.replace(r, priority=self._priority(int(r.workload_id), now)) for r in running]
        return running

    def _start(self, loop: EventLoop[Event], now: float, bind: Bind) -> None:
        i = int(bind.workload_id)
        placements = bind.placements
        for placement in placements:
            self.state.bind(placement)
            self.allocated_milli += placement.total_gpu_milli
        self.placements[i] = placements
        where = tuple((self.state.nodes[p.node].name, p.gpu_indices, p.gpu_milli_each) for p in placements)
        self.starts.append(StartRecord(now, self.jobs[i].id, where))
        admission = self.scheduler.charge(bind)
        job = self.jobs[i]
        low, high = elastic_bounds(job, self.policy)
        end, partners = self.clock.begin(now, i, placements)
        if admission is not None:
            self.running[i] = RunningWorkload(
                str(i),
                self._queue(i),
                job.priority,
                placements,
                admission,
                now,
                self._preemptible(job),
                self._resumes(job),
                expected_end_s=end,
                elastic_min=low,
                elastic_max=high,
                gang=job.gang if low is not None else None,
            )
        if self.accounts:
            self.accounts.received_milli[self._queue(i)] += self._received_milli(i)
        self.pending.remove(i)
        if np.isnan(self.start_s[i]):  # waiting time counts until the first start
            self.start_s[i] = now
        self.finish_s[i] = end
        if end < math.inf:  # else it waits on its GPU until a partner leaves (sim/colocation.py), then is retimed
            loop.schedule(end, ("depart", i, self.tokens[i]), priority=0)
        if self.las:
            self.service.start(i, now)
            self.guard = self.guard.record([str(i)])  # every run is protected for its first minimum run time
            self.schedule_rechecks(now, i, end - now, PREEMPTION_MIN_RUNTIME_S)
        self.clock.retime_partners(now, partners)

    def schedule_rechecks(self, now: float, i: int, left_s: float, guard_left_s: float | None) -> None:
        """LAS: a running job may become a victim when its LAS queue drops and when its guard expires (in
        ``guard_left_s``): step again then, if before it ends (in ``left_s``)."""
        if not self.las:
            return
        delays = self.service.recheck_delays(i, self._gpus(i))
        if guard_left_s is not None:
            delays.append(guard_left_s)
        for delay in delays:
            if delay < left_s:
                self.loop.schedule(now + delay, ("recheck", i, self.tokens[i]), priority=0)

    def _received_milli(self, i: int) -> int:
        """GPU milli a running job receives, all its workers (as requested, before static rounding)."""
        return self.jobs[i].request.total_gpu_milli * len(self.placements[i])

    def _stop(self, i: int) -> None:
        """Release a running job's placements and quota."""
        self.service.stop(i, self.last_s, self._gpus(i))
        if self.accounts:
            self.accounts.received_milli[self._queue(i)] -= self._received_milli(i)
        for placement in self.placements.pop(i):
            self.state.release(placement)
            self.allocated_milli -= placement.total_gpu_milli
        running = self.running.pop(i, None)
        if running is not None:
            self.scheduler.release(running.admission)
        self.clock.end(self.last_s, i)
        self.releases += 1

    def _preempt(self, now: float, preempt: Preempt) -> None:
        """Stop a running job and return it to pending: with the share of its work still to do if checkpointed (it
        may restart on another GPU model, at that model's speed), else from zero."""
        i = int(preempt.workload_id)
        preemptor = int(preempt.preemptor)
        if self._queue(preemptor) != self._queue(i):
            self.reclaims += 1
        checkpointed = self.running[i].checkpointed
        if checkpointed:
            self.clock.suspend(now, i)
        self._stop(i)
        self.tokens[i] += 1
        self.finish_s[i] = np.nan
        self.preemptions += 1
        self.guard = self.guard.record([str(i)])
        self.pending.add(i)
