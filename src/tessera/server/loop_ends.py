"""The scheduler loop's ends: what the end of a workload means, and how a wave of ends is written.

``end_outcome`` is the decision alone (no store, no books): why a stop was sent (``StopReason``) comes first, then
the service restarts, then the exit code. ``preemption_writes`` is what a tick's preemptions store (the stop whose
reason decides that later end). ``WriteBatch`` holds the loop's workload writes made inside one block
(the ends a poll reports, the cancels of a tick, the victims stopped) for one transaction at its end, and what the
loop changes in memory because of them for after that transaction: a block that raises, or whose transaction fails,
writes nothing and changes nothing, so its next attempt starts from the same books (issue 25). Used by
``server.loop``, which acts on both.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

from tessera.core.scheduler import Preempt
from tessera.core.workload import WorkloadState
from tessera.server.loop_values import LoopConfig, exit_text
from tessera.server.store.changes import StopChange, StopKind, StopReason, WorkloadChange
from tessera.server.store.models import WorkloadRow
from tessera.server.store.store import Event, Store


@dataclass(frozen=True, slots=True)
class EndOutcome:
    """What an end means: the workload ends in ``state``, or, when ``state`` is None, it waits again (requeued);
    ``reason`` is the text stored with it."""

    state: WorkloadState | None
    reason: str


def end_outcome(stop: StopReason | None, row: WorkloadRow, code: int | None, config: LoopConfig) -> EndOutcome:
    """The end of ``row``'s process (``code`` None: no exit code), given the stop the loop sent it, if any: a cancel
    ends it cancelled, the watchdog or its walltime failed, a preemption requeues it (or ends it preempted when
    ``config.requeue_preempted`` is off); a service that exited on its own restarts up to
    ``config.service_max_restarts`` times, unless it is a model's replica (the serving controller replaces those,
    backing off while they keep failing: ``serving.replica_health``); otherwise the exit code decides between
    succeeded and failed."""
    if stop is not None and stop.kind is StopKind.CANCEL:
        return EndOutcome(WorkloadState.CANCELLED, "cancelled")
    if stop is not None and stop.kind is StopKind.WATCHDOG:
        return EndOutcome(WorkloadState.FAILED, stop.text())
    if stop is not None and stop.kind is StopKind.TIMEOUT:
        return EndOutcome(WorkloadState.FAILED, stop.detail)
    if stop is not None:  # preempted
        if config.requeue_preempted:
            return EndOutcome(None, f"{stop.text()}; requeued")
        return EndOutcome(WorkloadState.PREEMPTED, stop.text())
    if row.kind == "service" and row.model_id is None and row.attempts <= config.service_max_restarts:
        return EndOutcome(None, f"service exited ({exit_text(code)}); restarting")
    if code == 0:
        return EndOutcome(WorkloadState.SUCCEEDED, "exit code 0")
    return EndOutcome(WorkloadState.FAILED, exit_text(code))


def preemption_writes(preempts: Sequence[Preempt]) -> tuple[list[WorkloadChange], list[Event]]:
    """What the store records of a tick's preemptions, before any victim is stopped: each victim's stop (its
    ``StopReason``, which decides what its end means) and an event naming its preemptor."""
    changes: list[WorkloadChange] = []
    events: list[Event] = []
    for preempt in preempts:
        wid = int(preempt.workload_id)
        changes.append(StopChange(wid, StopReason.preempted(preempt.reason)))
        events.append(Event(wid, "preempted", f"{preempt.reason} (for workload {preempt.preemptor})"))
    return changes, events


Effect = Callable[[], None]


@dataclass(slots=True)
class _Held:
    changes: list[WorkloadChange] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    effects: list[Effect] = field(default_factory=list)


class WriteBatch:
    """The loop's workload writes: inside a ``batched`` block they go in one transaction at its end (a wave of ends
    is one commit, not one per workload); outside one, each ``write`` is its own transaction. The ``then`` of a write
    (what the loop's memory makes of it) runs once its transaction is committed, in the order written: never when
    the block raised or the transaction failed."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._held: _Held | None = None

    @contextmanager
    def batched(self, now: float) -> Iterator[None]:
        if self._held is not None:  # already inside a batch: it writes them
            yield
            return
        held = _Held()
        self._held = held
        try:
            yield
        finally:
            self._held = None
        if held.changes or held.events:
            self._store.update_workloads(held.changes, held.events, now)
        for effect in held.effects:
            effect()

    def write(self, changes: list[WorkloadChange], events: list[Event], now: float, then: Effect | None = None) -> None:
        if self._held is not None:
            self._held.changes.extend(changes)
            self._held.events.extend(events)
            if then is not None:
                self._held.effects.append(then)
            return
        self._store.update_workloads(changes, events, now)
        if then is not None:
            then()
