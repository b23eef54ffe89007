"""A deployed model's replicas' health, as the serving controller tracks it: whether any replica is ready (its
engine answers, proven by the gateway), which replicas ended on their own (an engine that crashed or cannot start),
how long to wait before starting another, and the last error line.

A replica that ends without being asked to (a crash, an engine that cannot load its weights, an interpreter its
user cannot run) is a failure; failures in a row, with no replica ready meanwhile, make the controller back off
exponentially before it starts the next one (``BACKOFF_BASE_S`` doubling up to ``BACKOFF_CAP_S``), and from
``FAILING_AFTER`` on the model is ``failing``: the API, the CLI and the dashboard show it with the last error line,
a metric counts it, and the gateway answers its requests at once (503 with ``Retry-After``) instead of holding them
for a replica that will not come. A replica that becomes ready ends the streak.

Pure: ``now_s`` is an argument; the controller feeds it what the store says of ended replicas.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

BACKOFF_BASE_S = 1.0
BACKOFF_CAP_S = 300.0
FAILING_AFTER = 2  # failures in a row (no replica ready meanwhile) that make a model ``failing``
ENDED_ON_ITS_OWN = ("failed", "succeeded")  # a replica ending so was not stopped by anyone: a server never should


@dataclass(frozen=True, slots=True)
class ReplicaEnd:
    """How a replica workload ended, as the store recorded it."""

    workload_id: int
    state: str  # core.workload.WorkloadState's value: failed, succeeded, cancelled, preempted
    reason: str  # the end reason stored with it ("exit code 1")
    last_line: str = ""  # the last line of its log (the engine's own error, usually)

    @property
    def error(self) -> str:
        return f"{self.reason}: {self.last_line}" if self.last_line else self.reason


@dataclass(frozen=True, slots=True)
class ModelHealth:
    """What the API, the CLI, the dashboard, the metrics and the gateway are told of a model's health."""

    ready: int | None  # replicas proven ready by the gateway; None when no gateway tells (then: running ones)
    failures: int = 0  # replicas in a row that ended on their own with none ready meanwhile
    last_error: str = ""  # the last failure's reason and log line
    retry_at_s: float | None = None  # when the next replica may start (backing off); None: at once
    # Replicas that ended on their own, ever (the failures metric counts from it; not part of the health's value).
    failures_total: int = field(default=0, compare=False)

    @property
    def failing(self) -> bool:
        return self.failures >= FAILING_AFTER and not self.ready


def backoff_s(failures: int) -> float:
    """How long to wait before the next start after ``failures`` failures in a row."""
    if failures <= 0:
        return 0.0
    return float(min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2 ** min(failures - 1, 30)))


@dataclass
class HealthTracker:
    """One model's replicas as the controller last saw them, and its failure streak."""

    known: set[int] = field(default_factory=set)  # its active replica workloads at the last look
    stopped: set[int] = field(default_factory=set)  # those the controller asked to stop
    failures: int = 0
    last_failure_s: float = 0.0
    last_error: str = ""
    failures_total: int = 0  # ever (for the metric)

    def vanished(self, active: Iterable[int]) -> list[int]:
        """The replicas that were active and are not any more, and that nobody here asked to stop."""
        now_active = set(active)
        gone = sorted(self.known - now_active - self.stopped)
        self.stopped &= now_active
        self.known = now_active
        return gone

    def ended(self, ends: Iterable[ReplicaEnd], now_s: float) -> None:
        for end in ends:
            if end.state in ENDED_ON_ITS_OWN:
                self.failed(end.error, now_s)

    def failed(self, error: str, now_s: float) -> None:
        self.failures += 1
        self.failures_total += 1
        self.last_failure_s = now_s
        self.last_error = error

    def ready(self, count: int) -> None:
        if count > 0:
            self.failures = 0

    def may_start(self, now_s: float) -> bool:
        return now_s >= self.retry_at_s()

    def retry_at_s(self) -> float:
        return self.last_failure_s + backoff_s(self.failures)

    def health(self, ready: int | None, now_s: float) -> ModelHealth:
        retry = self.retry_at_s() if self.failures and not self.may_start(now_s) else None
        return ModelHealth(ready, self.failures, self.last_error if self.failures else "", retry, self.failures_total)
