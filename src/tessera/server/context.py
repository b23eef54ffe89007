"""``ServerContext``: what the API's routes read of one running server (store, loop, pool, metrics, clock, logs,
the queues' usage over time)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from tessera.server.logfiles import LogFiles
from tessera.server.loop import SchedulerLoop
from tessera.server.metrics import ServerMetrics
from tessera.server.pool import Pool
from tessera.server.replica_history import ReplicaHistory
from tessera.server.store.store import Store
from tessera.server.usage_history import UsageHistory
from tessera.serving.model_stats import ModelWindow
from tessera.serving.replica_health import ModelHealth
from tessera.serving.setups import DEFAULT_SETUP, PolicySetup, serving_setup


@dataclass
class ServerContext:
    store: Store
    loop: SchedulerLoop
    pool: Pool
    metrics: ServerMetrics
    clock: Callable[[], float]
    logs: LogFiles
    ready: bool = False  # the store is migrated and running workloads are re-adopted
    # The HTTP server is shutting down (``up.serve`` sets it from uvicorn): long responses such as the event stream
    # end then, since uvicorn waits for open responses before it stops.
    closing: Callable[[], bool] = lambda: False
    # The tier of each served model by id ("hot", "warm", "cold"), kept by ``model_cache.ModelCacheKeeper``.
    model_tiers: dict[int, str] = field(default_factory=dict)
    # Each served model's replicas' health by id (ready ones, failures in a row, the last error), kept by the serving
    # controller (``serving_plane.ServingPlane.record_health``).
    model_health: dict[int, ModelHealth] = field(default_factory=dict)
    # (workload id, attempt) -> whether the gateway serves that replica now (proven); None: no gateway, running is
    # ready. Set by ``tessera up`` from its serving front.
    replica_ready: Callable[[int, int], bool] | None = None
    # Each served model's recent requests (rate, latency percentiles, SLO attainment), recorded by the gateway; None:
    # no gateway. Set by ``tessera up`` from its serving front.
    model_window: ModelWindow | None = None
    # Each served model's replicas over time, told by the serving controller each tick (``up.serve``); None: none.
    replica_history: ReplicaHistory | None = None
    # Each queue's GPU usage over time (``GET /v1/queues/usage``), sampled after every step (``up.build_server``).
    usage: UsageHistory = field(default_factory=UsageHistory)
    # The serving setup the gateway and the controller run (``tessera up --serving-setup``, with ``--serving-set``
    # knobs applied, listed in ``serving_knobs``).
    serving_setup: PolicySetup = field(default_factory=lambda: serving_setup(DEFAULT_SETUP))
    serving_knobs: tuple[str, ...] = ()
