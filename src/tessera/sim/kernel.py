"""A tiny deterministic discrete-event kernel: a heap of ``(time, priority, sequence, event)``.

The sequence counter makes ties deterministic (first scheduled, first run), as in SimPy's kernel. The simulator's
experiments schedule arrivals (and later departures) here; the live control plane runs the same core step on a wall
clock instead of this loop.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

E = TypeVar("E")


@dataclass(order=True, slots=True)
class _Entry(Generic[E]):
    time_s: float
    priority: int
    sequence: int
    event: E = field(compare=False)


class EventLoop(Generic[E]):
    """Runs scheduled events in time order; handlers may schedule more events."""

    def __init__(self) -> None:
        self._heap: list[_Entry[E]] = []
        self._counter = itertools.count()
        self.now_s = 0.0

    def schedule(self, time_s: float, event: E, priority: int = 0) -> None:
        if time_s < self.now_s:
            raise ValueError(f"cannot schedule in the past: {time_s} < {self.now_s}")
        heapq.heappush(self._heap, _Entry(time_s, priority, next(self._counter), event))

    def __len__(self) -> int:
        return len(self._heap)

    def next_time_s(self) -> float | None:
        """When the next event happens, or ``None`` when none is scheduled."""
        return self._heap[0].time_s if self._heap else None

    def run(self, handle: Callable[[float, E], None], until_s: float | None = None) -> None:
        """Pop events in order and hand each to ``handle(now_s, event)`` until the heap is empty or ``until_s``."""
        while self._heap:
            if until_s is not None and self._heap[0].time_s > until_s:
                self.now_s = until_s
                return
            entry = heapq.heappop(self._heap)
            self.now_s = entry.time_s
            handle(entry.time_s, entry.event)
