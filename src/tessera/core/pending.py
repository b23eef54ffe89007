"""What a runtime offers the scheduler, and the scheduling of one instant: ``PendingOffer``.

Both runtimes (the timeline simulator and the control plane's loop) keep their waiting workloads here and schedule
with ``schedule_instant``, so that the twin and the live system offer the scheduler the same workloads in the same
order. Under StrictFIFO workloads wait per queue in arrival order, and a step is offered the first 64 of each queue.
Otherwise (backfill) they are grouped by request shape: a step is offered only the first workload of each shape,
since a shape that did not fit would not fit for the workloads behind it either, and a shape that failed is offered
again only once capacity has been released since (``released``: a workload ended or was preempted or shrunk, or a
running workload's LAS level or preemption guard changed, which may let a waiting one preempt it); binds alone never
make a failed request fit. Pure: no clock, no I/O.

Known limit (open): since one step sees one workload per shape, the second workload of a shape is placed only in the
next step of the instant, after lower-priority shapes of the first step; under LAS the guard then keeps it from
preempting those of its own priority class for ``preemption_min_runtime_s``, and a higher class from preempting
them in this instant (a run bound in the instant is never a victim of the class rule); the shape is offered again
at the next release. The simulator's published results were measured with this offer, so changing it needs them
re-measured.

A workload preempted in an instant is not offered again before the next instant (``PendingOffer.hold``): the
server requeues a victim only once its process has exited, after the tick that stopped it, so a simulator that
rebound it at once would decide differently from the server.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Sequence

from tessera.core.decisions import PendingWorkload, StepPlan
from tessera.core.scheduler import Scheduler
from tessera.core.workload import Request

Shape = tuple[Request, int, int, str, bool, int | None]  # request, gang, priority, queue, preemptible, elastic_min
STRICT_FIFO_WINDOW = 64  # workloads per queue a StrictFIFO step is offered


class PendingOffer:
    """The waiting workloads of one runtime, by id, and the count of capacity releases so far."""

    def __init__(self, strict_fifo: bool, shape_of: Callable[[str], Shape], fifo_key: Callable[[str], str]) -> None:
        self.strict_fifo = strict_fifo
        self.shape_of = shape_of  # a workload's shape (its priority as of now)
        self.fifo_key = fifo_key  # the StrictFIFO line a workload waits in
        self.fifo: dict[str, deque[str]] = {}
        self.groups: OrderedDict[Shape, deque[str]] = OrderedDict()
        # shape -> (the release count when it last failed, why its first workload waited then)
        self.failed_shapes: dict[Shape, tuple[int, str]] = {}
        self.releases = 0
        # Workloads added since ``reasons`` last ran: one may wait behind a shape (or far down a StrictFIFO line)
        # that no step of the instant offers, and would have no reason of its own (``unexplained`` gives it one).
        self.added: list[str] = []
        # Workloads preempted in the instant ``held_at``: not offered again before the next instant (``hold``).
        self.held: set[str] = set()
        self.held_at: float | None = None

    def hold(self, workload_ids: Iterable[str], now_s: float) -> None:
        """``workload_ids`` were preempted at ``now_s``: they wait for a later instant. In the control plane a
        victim waits again only once its process has exited, after the tick that stopped it; the simulator requeues
        it at once. Held for the rest of the instant, both offer it from the same instant on (test_same_decisions);
        a victim is never bound again in the instant it was preempted in."""
        self.instant(now_s)
        self.held.update(workload_ids)

    def instant(self, now_s: float) -> None:
        """Scheduling at ``now_s``: holds from an earlier instant end."""
        if self.held_at != now_s:
            self.held.clear()
            self.held_at = now_s

    def released(self) -> None:
        """Capacity was released (or a running workload may have become a victim): failed shapes are tried again."""
        self.releases += 1

    def add(self, workload_id: str) -> None:
        self.added.append(workload_id)
        if self.strict_fifo:
            self.fifo.setdefault(self.fifo_key(workload_id), deque()).append(workload_id)
        else:
            self.groups.setdefault(self.shape_of(workload_id), deque()).append(workload_id)

    def put_back(self, workload_ids: Sequence[str]) -> None:
        """``workload_ids`` were taken out (bound) and wait again, their binds undone (the runtime could not store
        them): each goes back to the head of its shape's group or its StrictFIFO line, in the order given."""
        for workload_id in reversed(workload_ids):
            self.added.append(workload_id)
            if self.strict_fifo:
                self.fifo.setdefault(self.fifo_key(workload_id), deque()).appendleft(workload_id)
            else:
                self.groups.setdefault(self.shape_of(workload_id), deque()).appendleft(workload_id)

    def remove(self, workload_id: str) -> None:
        if self.strict_fifo:
            self.fifo[self.fifo_key(workload_id)].remove(workload_id)
            return
        shape = self.shape_of(workload_id)
        members = self.groups[shape]
        members.remove(workload_id)
        if not members:
            del self.groups[shape]

    def candidates(self) -> list[str]:
        """The workloads to offer the next step."""
        if self.strict_fifo:
            lines = ([w for w in members if w not in self.held] for members in self.fifo.values())
            return [w for line in lines for w in line[:STRICT_FIFO_WINDOW]]
        firsts = [(shape, self._first(members)) for shape, members in self.groups.items()]
        return [w for shape, w in firsts if w is not None and not self._failed_now(shape)]

    def _first(self, members: deque[str]) -> str | None:
        """The first of a shape's workloads not held (``hold``), if any."""
        if not self.held:
            return members[0]
        return next((w for w in members if w not in self.held), None)

    def failed(self, workload_id: str, reason: str = "") -> None:
        """``workload_id`` did not fit (``reason``: why): its shape waits for the next release."""
        self.failed_shapes[self.shape_of(workload_id)] = (self.releases, reason)

    def _failed_now(self, shape: Shape) -> bool:
        """Whether ``shape`` failed since the last release (it is not offered again before the next)."""
        failed = self.failed_shapes.get(shape)
        return failed is not None and failed[0] == self.releases

    def retry_queues(self, queues: Iterable[str]) -> None:
        """Offer the failed shapes of ``queues`` again at once (a reclaim may now let them run)."""
        names = set(queues)
        for shape in [s for s in self.failed_shapes if s[3] in names]:
            del self.failed_shapes[shape]

    def heads(self, workload_of: Callable[[str], PendingWorkload]) -> list[PendingWorkload]:
        """The first pending workload of each request shape (what the reclaim measure looks at)."""
        firsts = (self._first(members) for members in self.groups.values())
        return [workload_of(w) for w in firsts if w is not None]

    def all_waiting_seen(self, waiting: dict[str, str]) -> bool:
        """True when a step saw what every pending workload waits for: each shape's first workload was in it and
        waits (a grow takes only capacity nobody waits for, and the step knows only the workloads it was given)."""
        firsts = (self._first(members) for members in self.groups.values())
        return all(w is None or w in waiting for w in firsts) and not any(self.fifo.values())

    def reasons(self, waiting: dict[str, str]) -> dict[str, str]:
        """``waiting`` with a reason for each workload no step was offered (``_shape_reason``)."""
        self.added.clear()
        spread = dict(waiting)
        if self.strict_fifo:
            for line, members in self.fifo.items():
                for workload_id in list(members)[STRICT_FIFO_WINDOW:]:
                    spread.setdefault(workload_id, _past_window(line))
            return spread
        for shape, members in self.groups.items():
            first = self._first(members)
            reason = self._shape_reason(shape, first, waiting)
            if first is None or reason is None:
                continue
            spread.setdefault(first, reason)
            behind = _behind(first, reason)
            for workload_id in members:
                if workload_id != first:
                    spread.setdefault(workload_id, behind)
        return spread

    def unexplained(self) -> dict[str, str]:
        """The reasons of the workloads added since ``reasons`` last ran that no step offered (their shape failed
        since the last release, or they are past a StrictFIFO line's window), as ``reasons`` gives them. One pass
        over each line or shape the added workloads joined, however many joined it."""
        added, self.added = self.added, []
        found: dict[str, str] = {}
        if self.strict_fifo:
            lines: dict[str, list[str]] = {}
            for workload_id in added:
                lines.setdefault(self.fifo_key(workload_id), []).append(workload_id)
            for line, joined in lines.items():
                past = set(list(self.fifo.get(line, ()))[STRICT_FIFO_WINDOW:])
                found.update((w, _past_window(line)) for w in joined if w in past)
            return found
        shapes: dict[Shape, list[str]] = {}
        for workload_id in added:
            shapes.setdefault(self.shape_of(workload_id), []).append(workload_id)
        for shape, joined in shapes.items():
            members = self.groups.get(shape)
            first = self._first(members) if members else None
            reason = self._shape_reason(shape, first, {})
            if members is None or first is None or reason is None:
                continue
            present = set(members)
            found.update((w, reason if w == first else _behind(first, reason)) for w in joined if w in present)
        return found

    def _shape_reason(self, shape: Shape, first: str | None, waiting: dict[str, str]) -> str | None:
        """Why ``shape``'s ``first`` workload waits: its reason in ``waiting``, else, when the shape is not offered
        again because it failed since the last release, the reason it failed with."""
        if first is None:
            return None
        reason = waiting.get(first)
        if reason is None and self._failed_now(shape):
            return self.failed_shapes[shape][1] or None
        return reason

    @property
    def no_shapes(self) -> bool:
        """Nothing waits in a backfill group."""
        return not self.groups


def _behind(first: str, reason: str) -> str:
    return f"behind workload {first} (same queue and request), which waits: {reason}"


def _past_window(line: str) -> str:
    return f"behind {STRICT_FIFO_WINDOW}+ earlier workloads of StrictFIFO queue {line}"


def growable(scheduler: Scheduler) -> bool:
    """Whether a running, preemptible elastic workload is below its maximum (a step with nothing pending may grow it;
    only those that can give workers back grow)."""
    return scheduler.config.elastic and any(
        r.preemptible and r.elastic_max is not None and len(r.placements) < r.elastic_max
        for r in scheduler.books.running.values()
    )


def schedule_instant(
    scheduler: Scheduler,
    offer: PendingOffer,
    now_s: float,
    workload_of: Callable[[str], PendingWorkload],
    apply: Callable[[StepPlan], None],
    reclaim_retry: bool,
    max_offered: int | None = None,
) -> None:
    """Every scheduling step of one instant: steps over the offered workloads until one binds nothing (each plan
    handed to ``apply``, which commits it and removes bound workloads from the offer); a plan's grows only when the
    step saw what every pending workload waits for, and with nothing pending a step for growth alone. With
    ``reclaim_retry`` (a preset that borrows), queues whose work is blocked by borrowers after that get their failed
    shapes offered again at once, and the steps run once more. ``max_offered`` bounds the workloads offered over
    all the steps (a live tick stays short; what is left waits for the next one); None: no bound."""
    budget = [max_offered]
    offer.instant(now_s)
    _steps(scheduler, offer, now_s, workload_of, apply, budget)
    if reclaim_retry:
        blocked = {h.queue for h in offer.heads(workload_of) if scheduler.blocked_by_borrowers(h)}
        if blocked:  # borrowers took quota after the owner's shapes failed: retry them (reclaim) now
            offer.retry_queues(blocked)
            _steps(scheduler, offer, now_s, workload_of, apply, budget)
    if unexplained := offer.unexplained():  # added behind shapes no step offered: an empty plan carries why
        apply(StepPlan(waiting=unexplained))


def _steps(
    scheduler: Scheduler,
    offer: PendingOffer,
    now_s: float,
    workload_of: Callable[[str], PendingWorkload],
    apply: Callable[[StepPlan], None],
    budget: list[int | None],
) -> None:
    while True:
        candidates = offer.candidates()
        left = budget[0]
        if left is not None:
            if left <= 0:
                return
            candidates = candidates[:left]
            budget[0] = left - len(candidates)
        if not candidates:
            if offer.no_shapes and growable(scheduler):  # nothing waits: elastic workloads may grow
                apply(scheduler.plan([], now_s))
            return
        plan = scheduler.plan([workload_of(w) for w in candidates], now_s)
        apply(dataclasses.replace(plan, grows=()))
        offer.hold((p.workload_id for p in plan.preempts), now_s)
        for workload_id, reason in plan.waiting.items():
            offer.failed(workload_id, reason)
        if plan.grows and offer.all_waiting_seen(plan.waiting):
            apply(StepPlan(grows=plan.grows))
        if not plan.binds:
            return
