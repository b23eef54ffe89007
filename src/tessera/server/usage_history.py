"""Each queue's GPU usage over time, kept in memory for ``GET /v1/queues/usage`` (the dashboard's queue view).

After every scheduling step the loop's snapshot is offered to ``UsageHistory.observe``, which keeps a sample of each
queue when its usage changed since the last sample, or when ``period_s`` has passed without a change (so a flat line
still has points). A sample holds the GPU share the queue has in use, how much of it is borrowed (in use beyond its
nominal quota, from its cohort) and its GPU nominal quota then, all in thousandths of a GPU. Changes closer together
than ``coalesce_s`` are folded into one sample (the first one's time, the last one's usage), so that a burst of
short workloads does not use up the window. Samples older than ``window_s`` are dropped, and each queue keeps at
most ``max_points`` of them; a queue that no longer exists loses its history. Nothing is stored: a restarted server
starts a new history.

The usage is the quota ledger's, as ``GET /v1/queues`` shows it: a policy without quotas has none (all zeros).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from tessera.core.queueing import QueueSpec
from tessera.server.records import NO_LIMIT

SAMPLE_PERIOD_S = 15.0
WINDOW_S = 24 * 3600.0
MAX_POINTS = 10_000  # per queue: 24 h at one sample per 15 s is 5,760; the rest leaves room for changes
COALESCE_S = 1.0


@dataclass(frozen=True, slots=True)
class UsageSample:
    at: float
    gpu_milli: int  # in use, summed over the queue's quota entries
    borrowed_milli: int  # in use beyond the nominal quota, summed over the entries that have a GPU quota
    nominal_milli: int | None  # the GPU nominal quota; None: some entry has no GPU limit (the pool is the limit)

    def same_usage(self, other: UsageSample) -> bool:
        return (self.gpu_milli, self.borrowed_milli, self.nominal_milli) == (
            other.gpu_milli,
            other.borrowed_milli,
            other.nominal_milli,
        )


def sample_of(spec: QueueSpec, usage: Mapping[str, tuple[int, int, int]], at: float) -> UsageSample:
    """A queue's sample from its spec and its usage per quota entry (``ClusterSnapshot.queue_usage``)."""
    used = borrowed = 0
    nominal: int | None = 0
    for flavor, quota in spec.nominal.items():
        gpu = usage.get(flavor, (0, 0, 0))[0]
        used += gpu
        if quota.gpu_milli >= NO_LIMIT:
            nominal = None
        else:
            borrowed += max(0, gpu - quota.gpu_milli)
            nominal = None if nominal is None else nominal + quota.gpu_milli
    return UsageSample(at, used, borrowed, nominal)


class UsageHistory:
    """The samples of every queue; ``observe`` is called by the loop's thread, ``read`` by the API's."""

    def __init__(
        self,
        period_s: float = SAMPLE_PERIOD_S,
        window_s: float = WINDOW_S,
        max_points: int = MAX_POINTS,
        coalesce_s: float = COALESCE_S,
    ) -> None:
        self.period_s = period_s
        self.window_s = window_s
        self.max_points = max_points
        self.coalesce_s = coalesce_s
        self._lock = threading.Lock()
        self._series: dict[str, deque[UsageSample]] = {}
        self._changed: dict[str, bool] = {}  # whether a queue's last sample was taken for a change

    def observe(
        self, now: float, specs: Iterable[QueueSpec], usage: Mapping[str, Mapping[str, tuple[int, int, int]]]
    ) -> None:
        """Sample every queue of ``specs`` whose usage changed, or whose last sample is ``period_s`` old."""
        with self._lock:
            seen: set[str] = set()
            for spec in specs:
                seen.add(spec.name)
                self._offer(spec.name, sample_of(spec, usage.get(spec.name, {}), now))
            for gone in set(self._series) - seen:
                del self._series[gone]
                self._changed.pop(gone, None)

    def _offer(self, queue: str, sample: UsageSample) -> None:
        series = self._series.setdefault(queue, deque(maxlen=self.max_points))
        last = series[-1] if series else None
        if last is None:
            series.append(sample)
            self._changed[queue] = True
        elif not sample.same_usage(last):
            if self._changed.get(queue) and sample.at - last.at < self.coalesce_s and len(series) > 1:
                series.pop()  # a change right after a change: one sample for both, at the first one's time
                if sample.same_usage(series[-1]):  # back to what it was: nothing happened at this scale
                    self._changed[queue] = False
                    return
                sample = UsageSample(last.at, sample.gpu_milli, sample.borrowed_milli, sample.nominal_milli)
            series.append(sample)
            self._changed[queue] = True
        elif sample.at - last.at >= self.period_s:
            series.append(sample)
            self._changed[queue] = False
        while series and series[0].at < sample.at - self.window_s:
            series.popleft()

    def read(
        self, queues: Iterable[str], since: float | None = None, limit: int | None = None
    ) -> dict[str, list[UsageSample]]:
        """The samples of ``queues`` (oldest first) taken at or after ``since``, at most the newest ``limit`` of each;
        a queue without samples yet has an empty list."""
        out: dict[str, list[UsageSample]] = {}
        with self._lock:
            for queue in queues:
                series = self._series.get(queue, ())
                points = [s for s in series if since is None or s.at >= since]
                out[queue] = points[-limit:] if limit is not None else points
        return out
