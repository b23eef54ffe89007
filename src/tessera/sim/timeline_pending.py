"""The timeline replay's waiting jobs (``PendingJobs``).

Under StrictFIFO they wait per queue in arrival order, and a step is offered the first 64 of each queue. Otherwise
(backfill) they are grouped by request shape: a step is offered only the first job of each shape, since a shape that
did not fit would not fit for the jobs behind it either, and a shape that failed is offered again only once capacity
has been released since (binds alone never make a failed request fit).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable, Iterable

from tessera.core.scheduler import PendingWorkload
from tessera.core.workload import Request

Shape = tuple[Request, int, int, str, bool, int | None]  # request, gang, priority, queue, preemptible, elastic_min
STRICT_FIFO_WINDOW = 64  # jobs per queue a StrictFIFO step is offered


class PendingJobs:
    def __init__(self, strict_fifo: bool, shape_of: Callable[[int], Shape], fifo_key: Callable[[int], str]) -> None:
        self.strict_fifo = strict_fifo
        self.shape_of = shape_of  # a job's shape (its priority as of now)
        self.fifo_key = fifo_key  # the StrictFIFO line a job waits in
        self.fifo: dict[str, deque[int]] = {}
        self.groups: OrderedDict[Shape, deque[int]] = OrderedDict()
        self.failed_at_release: dict[Shape, int] = {}  # shape -> the release count when it last failed

    def add(self, i: int) -> None:
        if self.strict_fifo:
            self.fifo.setdefault(self.fifo_key(i), deque()).append(i)
        else:
            self.groups.setdefault(self.shape_of(i), deque()).append(i)

    def remove(self, i: int) -> None:
        if self.strict_fifo:
            self.fifo[self.fifo_key(i)].remove(i)
            return
        shape = self.shape_of(i)
        members = self.groups[shape]
        members.remove(i)
        if not members:
            del self.groups[shape]

    def candidates(self, releases: int) -> list[int]:
        """The jobs to offer the next step, given the number of capacity releases so far."""
        if self.strict_fifo:
            return [i for members in self.fifo.values() for i in list(members)[:STRICT_FIFO_WINDOW]]
        return [members[0] for shape, members in self.groups.items() if self.failed_at_release.get(shape) != releases]

    def failed(self, i: int, releases: int) -> None:
        """Job ``i`` did not fit: its shape waits for the next release."""
        self.failed_at_release[self.shape_of(i)] = releases

    def retry_queues(self, queues: Iterable[str]) -> None:
        """Offer the failed shapes of ``queues`` again at once (a reclaim may now let them run)."""
        names = set(queues)
        for shape in [s for s in self.failed_at_release if s[3] in names]:
            del self.failed_at_release[shape]

    def heads(self, workload_of: Callable[[int], PendingWorkload]) -> list[PendingWorkload]:
        """The first pending workload of each request shape (what the reclaim measure looks at)."""
        return [workload_of(members[0]) for members in self.groups.values()]

    def all_waiting_seen(self, waiting: dict[str, str]) -> bool:
        """True when a step saw what every pending job waits for: each shape's first job was in it and waits (a grow
        takes only capacity nobody waits for, and the step knows only the jobs it was given)."""
        return all(str(m[0]) in waiting for m in self.groups.values()) and not any(self.fifo.values())

    @property
    def no_shapes(self) -> bool:
        """Nothing waits in a backfill group."""
        return not self.groups
