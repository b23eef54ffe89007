"""Each served model's replicas over time, kept in memory for ``GET /v1/models/NAME/stats`` (the dashboard's models
view draws them).

The serving controller tells its sinks, once a tick, the models deployed and their replicas
(``serving.controller.ReplicaSink``); ``ReplicaHistory`` is one of them (``up.serve`` adds it). It keeps a point per
model when its counts changed since the last point: replicas ready (proven by the gateway; without a gateway, running
ones), running (started, ready or not), pending (waiting to be placed or launched) and desired (the autoscaler's
target, as the controller recorded it this tick). Points older than ``window_s`` go, except the newest of them (it
says what the counts were when the window begins); each model keeps at most ``max_points``; a model no longer
deployed loses its history. Nothing is stored: a restarted server starts a new history.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tessera.serving.controller import ReplicaView
from tessera.serving.replicas import DeployedModel

WINDOW_S = 3600.0
MAX_POINTS = 720  # per model: a change every 5 s for an hour


@dataclass(frozen=True, slots=True)
class ReplicaPoint:
    at: float  # the server's clock
    ready: int
    running: int
    pending: int
    desired: int

    def same_counts(self, other: ReplicaPoint) -> bool:
        return (self.ready, self.running, self.pending, self.desired) == (
            other.ready,
            other.running,
            other.pending,
            other.desired,
        )


class ReplicaHistory:
    """See the module docstring. ``desired_of(model id)``: the controller's target this tick (None: not recorded
    yet, then the replicas it keeps); ``readiness(workload id, attempt)``: whether the gateway serves that replica
    (None: no gateway, running is ready)."""

    def __init__(
        self,
        clock: Callable[[], float],
        desired_of: Callable[[int], int | None] = lambda model_id: None,
        readiness: Callable[[int, int], bool] | None = None,
        window_s: float = WINDOW_S,
        max_points: int = MAX_POINTS,
    ) -> None:
        self.clock = clock
        self.desired_of = desired_of
        self.readiness = readiness
        self.window_s = window_s
        self.max_points = max_points
        self._points: dict[int, deque[ReplicaPoint]] = {}
        self._lock = threading.Lock()

    def publish(self, models: Sequence[DeployedModel], replicas: dict[int, list[ReplicaView]]) -> None:
        now = self.clock()
        points = {m.id: self.point_of(m, replicas.get(m.id, []), now) for m in models}
        with self._lock:
            for gone in self._points.keys() - points.keys():
                del self._points[gone]
            for model_id, point in points.items():
                self._add(model_id, point, now)

    def point_of(self, model: DeployedModel, replicas: list[ReplicaView], now: float) -> ReplicaPoint:
        kept = [r for r in replicas if not r.stopping]
        running = [r for r in kept if r.running]
        ready = (
            len(running) if self.readiness is None else sum(self.readiness(r.workload_id, r.attempt) for r in running)
        )
        desired = self.desired_of(model.id)
        return ReplicaPoint(
            now, ready, len(running), len(kept) - len(running), len(kept) if desired is None else desired
        )

    def _add(self, model_id: int, point: ReplicaPoint, now: float) -> None:
        series = self._points.setdefault(model_id, deque(maxlen=self.max_points))
        if not series or not series[-1].same_counts(point):
            series.append(point)
        self._trim(series, now)

    def _trim(self, series: deque[ReplicaPoint], now: float) -> None:
        start = now - self.window_s
        while len(series) > 1 and series[1].at <= start:
            series.popleft()

    def points(self, model_id: int) -> list[ReplicaPoint]:
        """``model_id``'s points, oldest first (none before the controller's first tick with it)."""
        now = self.clock()
        with self._lock:
            series = self._points.get(model_id)
            if series is None:
                return []
            self._trim(series, now)
            return list(series)
