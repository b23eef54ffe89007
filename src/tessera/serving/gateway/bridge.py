"""The gateway's side of the serving controller in ``tessera up``: the controller's demand source, its replica sink,
and the gateway's registry kept in step with the store.

- ``GatewayBridge.take_demand``: requests in flight and held, per model (the autoscaler's signal).
- ``GatewayBridge.publish`` (the controller's thread, once a tick): the models deployed, their routes (``route_of``:
  failing while their replicas keep failing) and their running replicas. On the gateway's event loop the registry
  becomes that; a replica not registered yet is proven first (``replica_probe.prove_replica``: its engine answers
  ``/health`` and the process listening on its socket is the replica's own), concurrently and never on the
  controller's thread, so a replica that hangs delays only itself. ``ready`` tells the controller which replicas
  are registered.
- ``LiveRegistry``: the registry, which also looks a model it does not know up (``lookup``), so that a model deployed
  a moment ago is held, never a 404.

The registry is changed only on the gateway's event loop (``call_soon_threadsafe``).
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from typing import NamedTuple

from tessera.serving.controller import DEFAULT_TARGETS, Demand, ReplicaView
from tessera.serving.engine_exec import PRIORITY_ENGINES
from tessera.serving.gateway.app import Gateway
from tessera.serving.gateway.registry import InMemoryRegistry, ModelRoute
from tessera.serving.gateway.replica_probe import prove_replica
from tessera.serving.policies.requests import SloClass
from tessera.serving.replica_health import ModelHealth
from tessera.serving.replicas import DeployedModel
from tessera.serving.setups import DEFAULT_SETUP, PolicySetup, serving_setup

log = logging.getLogger(__name__)

HEALTH_TIMEOUT_S = 0.5
MISS_TTL_S = 0.25  # an unknown model name is looked up in the store again after this long
ReplicaKey = tuple[int, int]  # (workload id, attempt): a replica restarted in place is proven again


class Target(NamedTuple):
    """Where a replica listens, and the key it requires there (None: none, behind its private socket)."""

    address: str
    api_key: str | None


class LiveRegistry(InMemoryRegistry):
    """The gateway's registry, fed by the controller each tick, that also looks a model it does not know up in the
    store: a model deployed a moment ago is served (held until a replica is up), never a 404, even before the
    controller's next tick. Names found unknown are remembered for ``MISS_TTL_S`` so that a flood of made-up
    names costs the store one read per name and interval."""

    def __init__(self, lookup: Callable[[str], ModelRoute | None]) -> None:
        super().__init__()
        self.lookup = lookup
        self.looked_up: dict[str, float] = {}  # route deployed by a look-up -> when (monotonic)
        self._misses: dict[str, float] = {}

    def route(self, model: str) -> ModelRoute | None:
        found = super().route(model)
        if found is not None:
            return found
        now = time.monotonic()
        if self._misses.get(model, 0.0) > now:
            return None
        found = self.lookup(model)
        if found is None:
            if len(self._misses) > 10_000:
                self._misses.clear()
            self._misses[model] = now + MISS_TTL_S
            return None
        self.looked_up[model] = now
        self.deploy(found)
        return found


def route_of(
    model: DeployedModel, setup: PolicySetup, health: ModelHealth | None = None, now_s: float = 0.0
) -> ModelRoute:
    """The gateway's route of ``model`` under the serving ``setup``: its router (its own, else the setup's);
    failing (answered 503 at once) while its replicas keep failing; admission as the setup says. With the setup's
    late binding a replica takes a request while its KV cache has room for it, and at most as many at once as the
    autoscaler aims at per replica of its engine (``DEFAULT_TARGETS``); more wait at the gateway for room, or for
    the replicas the autoscaler starts meanwhile. Without it, requests wait only while no replica is ready. An
    engine that schedules by request priority gets each request's SLO class as its ``priority`` where the setup
    orders engines' queues by class (``engine_priority``, as the twin's engine then does)."""
    failing = health.last_error or "no replica is ready" if health is not None and health.failing else ""
    retry_after_s = 0
    if failing and health is not None and health.retry_at_s is not None:
        retry_after_s = max(1, math.ceil(health.retry_at_s - now_s))
    slo = SloClass.parse(model.slo)
    concurrency = math.ceil(DEFAULT_TARGETS.get(model.engine, 0.0)) if setup.late_binding else 0
    router = model.router or setup.router
    return ModelRoute(
        model.name, model.tenant, slo, router, int(model.created_s), failing, retry_after_s, concurrency,
        kv_room=setup.late_binding, admission=setup.admission, engine_priority=model.engine in PRIORITY_ENGINES,
        class_priority=setup.engine_priority and model.engine in PRIORITY_ENGINES,
    )  # fmt: skip


class GatewayBridge:
    """See the module docstring. ``owns(workload_id, pid)``: is that process the replica's own; ``health(model
    id)``: the model's health as the controller saw it last."""

    def __init__(
        self,
        registry: LiveRegistry,
        gateway: Gateway,
        wake: threading.Event,
        owns: Callable[[int, int], bool],
        health: Callable[[int], ModelHealth | None] = lambda model_id: None,
        setup: PolicySetup | None = None,
    ) -> None:
        self.setup = setup or serving_setup(DEFAULT_SETUP)
        self.registry = registry
        self.gateway = gateway
        self.wake = wake  # set when a request waits for a model with no replica
        self.owns = owns
        self.health = health
        self.loop: asyncio.AbstractEventLoop | None = None
        self.proven: frozenset[ReplicaKey] = frozenset()  # the replicas registered now (read by the controller)
        self._endpoints: dict[str, dict[ReplicaKey, int]] = {}  # model -> replica -> registry replica id
        self._wanted: dict[str, dict[ReplicaKey, Target]] = {}  # model -> replica -> where, as last published
        self._proving: dict[ReplicaKey, asyncio.Task[None]] = {}
        self._refused: dict[ReplicaKey, str] = {}  # why a replica was not registered (logged once per reason)
        self._last_busy: dict[str, float] = {}

    # ------------------------------------------------------------------------------------ the demand source
    def take_demand(self, model_key: str) -> Demand:
        name = model_key.partition("/")[2] or model_key
        loads = self.gateway.replicas.loads(name)
        in_flight = sum(load.inflight for load in loads)
        held = self.gateway.hold.held(name)
        now = time.time()
        if in_flight or held:
            self._last_busy[name] = now
        ttft, tpot = self.gateway.latency.recent(name, now)
        capacities = [load.scraped.kv_capacity_tokens for load in loads if load.scraped.kv_capacity_tokens > 0]
        return Demand(
            in_flight=in_flight, held=held, last_request_s=self._last_busy.get(name),
            queued=sum(load.scraped.waiting for load in loads), ttft_recent_s=ttft, tpot_recent_s=tpot,
            tokens_per_sequence=self.gateway.latency.footprint(name), kv_tokens_per_replica=min(capacities, default=0),
        )  # fmt: skip

    def ready(self, workload_id: int, attempt: int) -> bool:
        """Whether that replica was proven and registered (the controller's ``readiness``)."""
        return (workload_id, attempt) in self.proven

    # -------------------------------------------------------------------------------------- the replica sink
    def publish(self, models: Sequence[DeployedModel], replicas: dict[int, list[ReplicaView]]) -> None:
        """Routes for the models deployed; their running replicas, registered once proven (on the loop)."""
        if self.loop is None:
            return
        snapshot_s, now_s = time.monotonic(), time.time()
        routes: list[ModelRoute] = []
        wanted: dict[str, dict[ReplicaKey, Target]] = {}
        for m in models:
            if m.deleting:
                continue
            routes.append(route_of(m, self.setup, self.health(m.id), now_s))
            wanted[m.name] = {
                (r.workload_id, r.attempt): Target(r.address, r.api_key)
                for r in replicas.get(m.id, [])
                if r.running and not r.stopping and r.address is not None
            }
        self.loop.call_soon_threadsafe(self._apply, routes, wanted, snapshot_s)

    def _apply(self, routes: list[ModelRoute], wanted: dict[str, dict[ReplicaKey, Target]], snapshot_s: float) -> None:
        """On the gateway's loop: the registry becomes ``routes`` with the ``wanted`` replicas, those not registered
        yet once proven. A route the registry looked up after this snapshot was read stays (the snapshot is older
        than its deployment)."""
        looked_up = self.registry.looked_up
        for gone in {r.name for r in self.registry.routes()} - {r.name for r in routes}:
            if looked_up.get(gone, -math.inf) >= snapshot_s:
                continue
            self.registry.undeploy(gone)
            self._endpoints.pop(gone, None)
            looked_up.pop(gone, None)
        self._wanted = wanted
        for route in routes:
            if self.registry.route(route.name) != route:
                self.registry.deploy(route)
            known = self._endpoints.setdefault(route.name, {})
            for key in list(known):
                if key not in wanted[route.name]:
                    self.registry.remove_replica(route.name, known.pop(key))
            for key, target in wanted[route.name].items():
                if key not in known and key not in self._proving:
                    self._proving[key] = asyncio.ensure_future(self._prove(route.name, key, target))
        self._note_proven()

    async def _prove(self, model: str, key: ReplicaKey, target: Target) -> None:
        """Register the replica once it is proven; an impostor at its address is logged (once per reason)."""
        address = target.address
        try:
            proof = await prove_replica(address, lambda pid: self.owns(key[0], pid), HEALTH_TIMEOUT_S, target.api_key)
        finally:
            self._proving.pop(key, None)
        if not proof.ready:
            if proof.listener_pid is not None and self._refused.get(key) != proof.reason:
                if len(self._refused) > 10_000:
                    self._refused.clear()
                self._refused[key] = proof.reason
                log.warning("replica workload %d at %s not registered: %s", key[0], address, proof.reason)
            return
        self._refused.pop(key, None)
        known = self._endpoints.get(model)
        if known is None or key in known or self._wanted.get(model, {}).get(key) != target:
            return  # the model or the replica went meanwhile
        known[key] = self.registry.add_replica(model, address, proof.listener_pid, target.api_key)
        log.info("model %s: replica workload %d registered at %s", model, key[0], address)
        self._note_proven()

    def _note_proven(self) -> None:
        self.proven = frozenset(key for known in self._endpoints.values() for key in known)
