"""The timeline simulator: workloads arrive, wait, run for their duration and leave, on one scheduling core.

Each event time (arrivals, then departures that free capacity) is followed by scheduling steps of the same
``tessera.core.scheduler.Scheduler`` the control plane runs, built from the same named presets
(``tessera.core.presets``: static, fifo-share, tiresias, gavel, tessera and reference variants), until a step binds
nothing. Every plan is applied to the scheduler's books by ``Scheduler.commit`` and every departure reported with
``Scheduler.observe``, exactly as the server does; the replay adds only physics and measurements. Pending workloads
are offered and the steps of an instant run as in the control plane (``core.pending``: the first workload of each
request shape, a failed shape again only after a release).

**Physics, the same under every policy.** A running job's speed (``sim.replay.progress.Progress``) is its
isolated speed on its GPU model times ``workers / gang`` times its co-location factor: with ``colocation`` given,
typed jobs on part of one GPU slow each other as the measured model says (``sim.replay.colocation``), and a change of
partners re-times the jobs on that GPU. A preempted, checkpointed job resumes with the share of its work still to do,
at the speed of the GPU model it restarts on; one without a checkpoint restarts from zero. An elastic job's runtime
follows its worker count (linear scaling of the whole-gang runtime, no resize overhead); the replay applies a plan's
grows only when the step saw what every pending job waits for (the first job of each request shape was in it and
still waits), and with nothing pending plans a step for growth alone. Under LAS a ``recheck`` event at each
threshold crossing and guard expiry of a running job triggers a step.

**Queues** (``queues=...``, the ``tenants`` workload): the scheduler admits against their quotas as its preset
says. Per queue the replay integrates the GPU it received and its entitlement over its busy times
(``sim.replay.accounts``: ``queue_shares``, ``jain_index``); ``sim.replay.reclaim`` measures how long borrowed
capacity kept its owner waiting (``reclaim_latency_max_s``, ``blocked_by_borrowers_max_s``).

Called by ``tessera simulate timeline`` and the benchmarks; its types are in ``tessera.sim.replay.result``.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import time
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from tessera.core.cluster import ClusterState, NodeSpec
from tessera.core.decisions import Bind, Decision, Grow, PendingWorkload, Preempt, RunningWorkload, Shrink, StepPlan
from tessera.core.fragmentation import typical_pods
from tessera.core.invariants import check_charges, check_cluster, check_quotas
from tessera.core.pending import PendingOffer, Shape, schedule_instant
from tessera.core.placement.base import TieBreak
from tessera.core.preset_knobs import knob_label, with_knobs
from tessera.core.presets import ONE_QUEUE, PREEMPTION_MIN_RUNTIME_S, Preset, build_scheduler, resolve_preset
from tessera.core.queueing import QueueSpec
from tessera.core.scheduler import QueueDiscipline
from tessera.core.throughput import ColocationModel, ThroughputModel
from tessera.core.workload import MILLI_PER_GPU, Request
from tessera.sim.kernel import EventLoop
from tessera.sim.replay.accounts import QueueAccounts, jain_index
from tessera.sim.replay.reclaim import ReclaimTracker
from tessera.sim.replay.result import StartRecord, TimelineJobLike, TimelineResult
from tessera.sim.replay.runs import RunClock

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
    record_decisions: bool = False,
    runtimes_known: bool = True,
    placement: str | None = None,
    knobs: Sequence[str] = (),
) -> TimelineResult:
    """Replay ``jobs`` on ``nodes`` under one policy; every job either finishes or never fits.

    A job without ``duration_s`` runs ``work_steps / throughput(job_type, model)`` seconds on the GPU model it got.
    With ``queues`` every job's ``queue`` must name one of them (module docstring). ``check_invariants`` (debug
    mode, for tests) checks the cluster and the quota ledger after every step (``core.invariants``);
    ``record_decisions`` keeps every applied decision (``TimelineResult.decisions``, ``Scheduler.journal``);
    ``runtimes_known=False`` hides the runtimes from the scheduler (a server's workloads declare none);
    ``placement`` replaces the preset's placement policy (``tessera up --placement`` does the same live), and the
    result is then labelled ``PRESET+PLACEMENT``; ``knobs`` (``KEY=VALUE``, ``core.preset_knobs``: ``tessera up --set``
    does the same live) change the preset, and the label says so (``PRESET[KEY=VALUE]``).
    """
    preset = with_knobs(resolve_preset(policy_name, "--policies"), knobs)
    replay = _Replay(
        nodes, jobs, preset, seed, throughput or ThroughputModel({}), tuple(queues), colocation, runtimes_known,
        placement,
    )  # fmt: skip
    replay.label += knob_label(knobs)
    replay.check_invariants = check_invariants
    if record_decisions:
        replay.scheduler.journal = []
    return replay.run()


class EventKind(enum.Enum):
    DEPART = "depart"  # a run ends (stale when its run token is old: the run was preempted or re-timed)
    RECHECK = "recheck"  # a running job's LAS level drops or its guard expires: step again
    ARRIVE = "arrive"


class Event(NamedTuple):
    kind: EventKind
    job: int  # index into the replay's jobs
    token: int  # the run it belongs to: a depart or recheck of an earlier run is stale


class _Replay:
    def __init__(
        self,
        nodes: Sequence[NodeSpec],
        jobs: Sequence[TimelineJobLike],
        preset: Preset,
        seed: int,
        throughput: ThroughputModel,
        queues: tuple[QueueSpec, ...] = (),
        colocation: ColocationModel | None = None,
        runtimes_known: bool = True,
        placement: str | None = None,
    ):
        self.preset = preset
        self.label = preset.name if placement in (None, preset.placement) else f"{preset.name}+{placement}"
        self.jobs = [j for j in jobs if j.duration_s is not None or j.work_steps is not None]
        self.requests = [_typed(preset.request_of(j.request), j) for j in self.jobs]
        self.state = ClusterState(sorted(nodes, key=lambda n: n.name))
        self.scheduler = build_scheduler(
            preset,
            self.state,
            queues,
            seed=seed,
            typical=typical_pods(self.requests),
            throughput=throughput,
            colocation=colocation,
            tie_break=TieBreak.FIRST,
            placement=placement,
        )
        self.books = self.scheduler.books
        self.las = bool(preset.las_thresholds_gpu_s)
        self.accounts = QueueAccounts(queues, self.state) if queues else None
        self.start_s = np.full(len(self.jobs), np.nan)
        self.finish_s = np.full(len(self.jobs), np.nan)
        self.run_started_s: dict[int, float] = {}  # when each running job's current run started
        self.starts: list[StartRecord] = []
        self.tokens = [0] * len(self.jobs)
        self.clock = RunClock(self.jobs, self.state, throughput, colocation, self._retimed)
        self.loop: EventLoop[Event] = EventLoop()
        strict = preset.discipline is QueueDiscipline.STRICT_FIFO
        self.pending = PendingOffer(strict, self._shape, lambda w: self._queue(int(w)))
        self.preemptions = 0
        self.reclaims = 0
        self.shrunk_workers = 0
        self.grown_workers = 0
        self.reclaim = ReclaimTracker(self.scheduler, seed)
        self.check_invariants = False
        self.runtimes_known = runtimes_known  # the scheduler is told how long jobs run (head reservation reads it)
        self.allocated_milli = 0
        self.alloc_integral = 0.0
        self.last_s = 0.0
        self.alloc_times: list[float] = []
        self.alloc_values: list[float] = []

    def run(self) -> TimelineResult:
        started = time.perf_counter()
        order = sorted(range(len(self.jobs)), key=lambda i: (self.jobs[i].arrival_s, self.jobs[i].id))
        for i in order:
            self.loop.schedule(self.jobs[i].arrival_s, Event(EventKind.ARRIVE, i, 0), priority=1)
        first = self.jobs[order[0]].arrival_s if order else 0.0
        self.last_s = first
        self.loop.run(self._handle)
        done = ~np.isnan(self.finish_s)
        span = max(float(np.nanmax(self.finish_s)) - first, 1e-9) if done.any() else 1e-9
        capacity = self.state.gpu_capacity_milli
        shares = self.accounts.shares() if self.accounts else {}
        return TimelineResult(
            self.label,
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
            shrunk_workers=self.shrunk_workers,
            grown_workers=self.grown_workers,
            decisions=tuple(self.scheduler.journal or ()),
        )

    # ------------------------------------------------------------------------------------------------ events

    def _handle(self, now: float, event: Event) -> None:
        self._advance(now)
        kind, i, token = event
        if kind is EventKind.DEPART:
            if token == self.tokens[i]:  # else the run it ended was preempted or re-timed
                ended = self.books.running[str(i)]
                self.scheduler.observe([str(i)], now)
                self._stopped(now, i, ended)
                if self.accounts:
                    self.accounts.demand_milli[self._queue(i)] -= self._milli(i)
        elif kind is EventKind.RECHECK:
            if token == self.tokens[i]:  # a running job's LAS queue dropped or its guard expired: retry the waiting
                self.pending.released()
        else:
            self.pending.add(str(i))
            if self.accounts:
                self.accounts.demand_milli[self._queue(i)] += self._milli(i)
        upcoming = self.loop.next_time_s()
        if upcoming is None or upcoming > now:  # schedule once all events of this instant are in
            reclaim = self.preset.borrowing and self.accounts is not None
            schedule_instant(self.scheduler, self.pending, now, self._pending_of, self._apply, reclaim)
            if reclaim:
                running = lambda: self.books.candidates(self.last_s)  # noqa: E731
                self.reclaim.track(now, self.pending.heads(self._pending_of), running)
            self.alloc_times.append(now)
            self.alloc_values.append(self.allocated_milli)

    def _advance(self, now: float) -> None:
        self.alloc_integral += self.allocated_milli * (now - self.last_s)
        if self.accounts:
            self.accounts.advance(now - self.last_s)
        self.last_s = now

    # --------------------------------------------------------------------------------------------- workloads

    def _milli(self, i: int) -> int:
        """GPU milli the job asks for, all workers (as requested, before static rounding)."""
        return self.jobs[i].request.total_gpu_milli * self.jobs[i].gang

    def _queue(self, i: int) -> str:
        if not self.accounts:
            return ONE_QUEUE
        return str(getattr(self.jobs[i], "queue", "default"))

    def _pending_of(self, workload_id: str) -> PendingWorkload:
        """The job as the scheduler is handed it: as the workload describes it (the scheduler applies LAS and the
        preset's preemptibility rule)."""
        i = int(workload_id)
        job = self.jobs[i]
        low, high = self.preset.elastic_bounds(
            getattr(job, "elastic_min", None), getattr(job, "elastic_max", None), job.work_steps is None
        )
        return PendingWorkload(
            workload_id,
            self.requests[i],
            job.arrival_s,
            job.priority,
            queue=self._queue(i),
            gang=job.gang,
            preemptible=bool(getattr(job, "preemptible", False)),
            expected_duration_s=self.clock.known_duration(i) if self.runtimes_known else None,
            elastic_min=low,
            elastic_max=high,
            checkpointed=bool(getattr(job, "checkpointed", False)),
        )

    def _shape(self, workload_id: str) -> Shape:
        w = self.scheduler.effective(self._pending_of(workload_id), self.last_s)
        return (w.request, w.gang, w.priority, w.queue, w.preemptible, w.elastic_min)

    # ------------------------------------------------------------------------------------------- scheduling

    def _apply(self, plan: StepPlan) -> None:
        self._commit(self.last_s, plan)
        self._check()

    def _commit(self, now: float, plan: StepPlan) -> None:
        """Apply ``plan`` to the books (``Scheduler.commit``), each decision followed by its physics."""

        def applied(decision: Decision, entry: RunningWorkload) -> None:
            if isinstance(decision, Bind):
                self._started(now, decision)
            elif isinstance(decision, Preempt):
                self._preempted(now, decision, entry)
            else:
                self._resized(now, decision, len(entry.placements))

        self.scheduler.commit(plan, now, applied)

    def _check(self) -> None:
        """Debug mode (``check_invariants``): the cluster, the quota rules and every running job's charge."""
        if self.check_invariants:
            check_cluster(self.state, list(self.books.placements()))
            if self.scheduler.ledger is not None:
                check_quotas(self.scheduler.ledger)
                check_charges(self.scheduler.ledger, list(self.books.running.values()))

    # -------------------------------------------------------------------------------------------- physics

    def _started(self, now: float, bind: Bind) -> None:
        i = int(bind.workload_id)
        placements = bind.placements
        self.allocated_milli += sum(p.total_gpu_milli for p in placements)
        where = tuple((self.state.nodes[p.node].name, p.gpu_indices, p.gpu_milli_each) for p in placements)
        self.starts.append(StartRecord(now, self.jobs[i].id, where))
        end, partners = self.clock.begin(now, i, placements)
        if self.runtimes_known:
            self.books.set_expected_end(bind.workload_id, end)
        self.run_started_s[i] = now
        if self.accounts:
            self.accounts.received_milli[self._queue(i)] += self.jobs[i].request.total_gpu_milli * len(placements)
        self.pending.remove(bind.workload_id)
        if np.isnan(self.start_s[i]):  # waiting time counts until the first start
            self.start_s[i] = now
        self.finish_s[i] = end
        if end < math.inf:  # else it waits on its GPU until a partner leaves (replay/colocation.py), then is retimed
            self.loop.schedule(end, Event(EventKind.DEPART, i, self.tokens[i]), priority=0)
        if self.las:
            self._schedule_rechecks(now, i, end - now, PREEMPTION_MIN_RUNTIME_S)
        self.clock.retime_partners(now, partners)

    def _stopped(self, now: float, i: int, ended: RunningWorkload) -> None:
        """Job ``i`` stopped (finished or preempted) off ``ended.placements``."""
        if self.accounts:
            self.accounts.received_milli[self._queue(i)] -= self.jobs[i].request.total_gpu_milli * len(ended.placements)
        self.allocated_milli -= sum(p.total_gpu_milli for p in ended.placements)
        self.run_started_s.pop(i, None)
        self.clock.end(now, i)
        self.pending.released()

    def _preempted(self, now: float, preempt: Preempt, victim: RunningWorkload) -> None:
        """A preempted job returns to pending: with the share of its work still to do if checkpointed (it may restart
        on another GPU model, at that model's speed), else from zero."""
        i = int(preempt.workload_id)
        if self._queue(int(preempt.preemptor)) != self._queue(i):
            self.reclaims += 1
        if victim.checkpointed:
            self.clock.suspend(now, i, victim.placements)
        self._stopped(now, i, victim)
        self.tokens[i] += 1
        self.finish_s[i] = np.nan
        self.preemptions += 1
        self.pending.add(preempt.workload_id)

    def _resized(self, now: float, resize: Shrink | Grow, workers: int) -> None:
        """An elastic job gave back (``Shrink``) or got (``Grow``) workers and runs ``workers`` now: its progress
        follows."""
        i = int(resize.workload_id)
        sign = -1 if isinstance(resize, Shrink) else 1
        self.allocated_milli += sign * sum(p.total_gpu_milli for p in resize.placements)
        if self.accounts:
            per_worker = self.jobs[i].request.total_gpu_milli
            self.accounts.received_milli[self._queue(i)] += sign * per_worker * len(resize.placements)
        if sign < 0:
            self.shrunk_workers += len(resize.placements)
            self.pending.released()  # capacity was freed: shapes that failed may fit now
        else:
            self.grown_workers += len(resize.placements)
        self.clock.resized(now, i, workers)

    def _retimed(self, now: float, i: int, end: float) -> None:
        """Running job ``i`` now ends at ``end`` (resize or co-location change): reschedule its departure (the old one,
        and its rechecks, become stale with a new run token) and its LAS rechecks."""
        self.tokens[i] += 1
        self.finish_s[i] = end
        if end < math.inf:
            self.loop.schedule(end, Event(EventKind.DEPART, i, self.tokens[i]), priority=0)
        if self.scheduler.ledger is not None and i in self.run_started_s:
            if self.runtimes_known:
                self.books.set_expected_end(str(i), end)
            guard_left = self.run_started_s[i] + PREEMPTION_MIN_RUNTIME_S - now
            self._schedule_rechecks(now, i, end - now, guard_left if guard_left > 0 else None)

    def _schedule_rechecks(self, now: float, i: int, left_s: float, guard_left_s: float | None) -> None:
        """LAS: a running job may become a victim when its LAS queue drops and when its guard expires (in
        ``guard_left_s``): step again then, if before it ends (in ``left_s``)."""
        las = self.books.las
        if las is None:
            return
        placements = self.books.running[str(i)].placements
        delays = las.recheck_delays(str(i), sum(p.request.total_gpu_milli for p in placements) / MILLI_PER_GPU)
        if guard_left_s is not None:
            delays.append(guard_left_s)
        for delay in delays:
            if delay < left_s:
                self.loop.schedule(now + delay, Event(EventKind.RECHECK, i, self.tokens[i]), priority=0)
