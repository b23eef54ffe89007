"""Priority classes and the order of pending work within one queue.

A ``PriorityClass`` names a priority value and whether work of that class may be preempted. Three are built in:
``inference-critical`` (1000, never preempted), ``training`` (500) and ``best-effort`` (100). Within a queue,
pending work is ordered by priority (higher first), then arrival time, then id (``order_key``).

Two strategies (Kueue's) decide what may be admitted in that order (``admissible_in_order``):

- ``StrictFIFO``: admit in order and stop at the first workload that does not fit; nothing overtakes the head.
- ``BestEffortFIFO``: a workload that does not fit is skipped and later ones that fit go ahead.

Pure functions; the scheduler calls them once per queue per step.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Protocol, TypeVar

from tessera.core.errors import InvalidRequestError
from tessera.core.queueing.quotas import QUEUEING_STRATEGIES, QueueingStrategy


@dataclass(frozen=True, slots=True)
class PriorityClass:
    name: str
    value: int  # larger runs first and may preempt smaller within its queue
    preemptible: bool  # False: never chosen as a preemption victim

    def __post_init__(self) -> None:
        if not self.name:
            raise InvalidRequestError("priority_class", "a priority class needs a name")


INFERENCE_CRITICAL = PriorityClass("inference-critical", 1000, preemptible=False)
TRAINING = PriorityClass("training", 500, preemptible=True)
BEST_EFFORT = PriorityClass("best-effort", 100, preemptible=True)
BUILTIN_PRIORITY_CLASSES: Mapping[str, PriorityClass] = MappingProxyType(
    {c.name: c for c in (INFERENCE_CRITICAL, TRAINING, BEST_EFFORT)}
)


def resolve_priority_class(name: str, classes: Mapping[str, PriorityClass] = BUILTIN_PRIORITY_CLASSES) -> PriorityClass:
    """The class called ``name`` (case-insensitive); raises ``InvalidRequestError("priority_class", ...)``."""
    found = classes.get(name.strip().lower()) or classes.get(name)
    if found is None:
        known = ", ".join(sorted(classes))
        raise InvalidRequestError("priority_class", f"unknown priority class {name!r} (known: {known})")
    return found


class Pending(Protocol):
    """What ordering needs to know about a pending workload."""

    @property
    def workload_id(self) -> str: ...

    @property
    def priority(self) -> int: ...

    @property
    def arrival_s(self) -> float: ...


@dataclass(frozen=True, slots=True)
class PendingEntry:
    """A plain ``Pending`` value."""

    workload_id: str
    priority: int
    arrival_s: float  # when it entered the queue, seconds on the scheduler's clock


P = TypeVar("P", bound=Pending)
T = TypeVar("T")


def order_key(priority: int, arrival_s: float, workload_id: str) -> tuple[int, float, str]:
    """Sort key within a queue: higher priority first, then earlier arrival, then id."""
    return (-priority, arrival_s, workload_id)


def order_pending(pending: Iterable[P]) -> list[P]:
    """``pending`` in queue order (``order_key``)."""
    return sorted(pending, key=lambda w: order_key(w.priority, w.arrival_s, w.workload_id))


def admissible_in_order(
    pending: Sequence[T], fits: Callable[[T], bool], strategy: QueueingStrategy = "StrictFIFO"
) -> list[T]:
    """The workloads of ``pending`` (already in queue order) that may be admitted now, in order.

    ``fits`` is asked in order, at most once per workload, and may reserve capacity when it answers True (so later
    answers see earlier admissions). StrictFIFO stops at the first False; BestEffortFIFO skips it and goes on.
    """
    if strategy not in QUEUEING_STRATEGIES:
        raise InvalidRequestError("strategy", f"{strategy!r} is not one of {', '.join(QUEUEING_STRATEGIES)}")
    admitted: list[T] = []
    for workload in pending:
        if fits(workload):
            admitted.append(workload)
        elif strategy == "StrictFIFO":
            break
    return admitted
