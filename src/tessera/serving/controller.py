"""The serving controller: each deployed model's replicas follow its autoscaler, as ``service`` workloads.

Once per tick, for every model, ``Controller.tick``:

1. reads the model's replicas (pending and running workloads) and its demand as the gateway sees it (requests in
   flight, requests held for want of a replica, arrivals, the last request's time);
2. asks the model's autoscaler (its own, else the serving setup's: ``serving.setups``; the decision is
   ``serving.policies.autoscaler.decide``, the very object the digital twin replays, configured as the twin configures
   it) for the replicas it wants, within the model's bounds, on the gateway's signals: in flight, held, queued in
   the engines, the recent TTFT and TPOT (``policies.slo_feedback``), the KV cache a replica holds;
3. submits the missing replicas through the control plane (so the core scheduler places them, they count against
   the tenant's quota and a crash loses nothing) and cancels the surplus, pending ones first, then the newest.

A replica that ends on its own (a crash, an engine that cannot start) is a failure: the next start waits an
exponential back-off, and a model whose replicas keep failing is ``failing`` (``replica_health``), which the control
plane records (``record_health``) for the API and the gateway. A replica counts as ready once the gateway has
proven it (``readiness``); without a gateway, once it runs.

A deleted model's replicas are cancelled; once none is left its record goes. The controller holds no state that a
restart would need: the replicas are in the store, and the autoscaler's memory starts afresh (the first decision
counts the replicas that exist).

The seams: ``ControlPlane`` (the server's store and scheduler, ``server.serving_plane``) and ``DemandSource``
(the gateway's view of the requests). Nothing here reads a clock: ``now_s`` is an argument.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from tessera.serving.policies.autoscaler import (
    AutoscalerConfig,
    AutoscalerState,
    ModelSignals,
    decide,
    knative_defaults,
    tessera_defaults,
)
from tessera.serving.policies.requests import DEFAULT_SLO_TARGETS, SloClass
from tessera.serving.replica_health import HealthTracker, ModelHealth, ReplicaEnd
from tessera.serving.replicas import DeployedModel
from tessera.serving.setups import DEFAULT_SETUP, PolicySetup, model_autoscaler, serving_setup
from tessera.serving.sizing import sequences_held

log = logging.getLogger(__name__)

# Requests in flight one replica aims at, per engine: the autoscaler's target (``target_concurrency``). A real
# engine batches many sequences; the numbers are conservative starting points, overridable per controller.
DEFAULT_TARGETS: dict[str, float] = {"vllm": 32.0, "sglang": 32.0, "transformers": 4.0, "sim": 32.0}


@dataclass(frozen=True, slots=True)
class ReplicaView:
    workload_id: int
    running: bool  # False: pending (waiting for room, or not yet launched)
    address: str | None  # where its engine listens: unix:PATH (its private socket) or http://HOST:PORT
    stopping: bool = False  # asked to stop, not yet ended
    attempt: int = 0  # its launches so far: a replica restarted in place is another process at the same address
    api_key: str | None = field(default=None, repr=False)  # its own secret, at a TCP address on another node


@dataclass(frozen=True, slots=True)
class Demand:
    in_flight: int = 0  # sent to replicas and not finished
    held: int = 0  # waiting at the gateway for a replica
    arrivals: int = 0  # since the previous call
    last_request_s: float | None = None  # None: no request seen yet
    queued: int = 0  # waiting inside the replicas' engines (their last scrape)
    ttft_recent_s: float | None = None  # the SLO feedback's latency (``policies.slo_feedback``); None: no data
    tpot_recent_s: float | None = None
    tokens_per_sequence: float | None = None  # the mean KV footprint of its requests (``updated_footprint``)
    kv_tokens_per_replica: int = 0  # the smallest KV cache of its replicas, as their engines export it; 0: unknown


class ControlPlane(Protocol):
    def models(self) -> list[DeployedModel]: ...

    def replicas(self, models: Sequence[DeployedModel]) -> dict[int, list[ReplicaView]]: ...

    def start_replica(self, model: DeployedModel) -> int: ...

    def stop_replica(self, workload_id: int) -> None: ...

    def record_desired(self, model: DeployedModel, desired: int) -> None: ...

    def forget(self, model: DeployedModel) -> None: ...

    def replica_end(self, workload_id: int) -> ReplicaEnd | None:
        """How a replica that is no longer pending or running ended (None if the store does not know it)."""
        ...

    def record_health(self, model: DeployedModel, health: ModelHealth) -> None: ...


class DemandSource(Protocol):
    def take_demand(self, model_key: str) -> Demand: ...


class ReplicaSink(Protocol):
    """Who is told, each tick, the models deployed and their replicas (the gateway's registry)."""

    def publish(self, models: Sequence[DeployedModel], replicas: dict[int, list[ReplicaView]]) -> None: ...


class NoDemand:
    """Before the gateway is wired in: no requests, so models sit at their minimum."""

    def take_demand(self, model_key: str) -> Demand:
        return Demand()


@dataclass
class Controller:
    plane: ControlPlane
    demand: DemandSource = field(default_factory=NoDemand)
    tick_s: float = 1.0
    targets: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_TARGETS))
    sinks: list[ReplicaSink] = field(default_factory=list)
    # (workload id, attempt) -> whether the gateway has proven that replica ready; None: no gateway, running is ready
    readiness: Callable[[int, int], bool] | None = None
    setup: PolicySetup = field(default_factory=lambda: serving_setup(DEFAULT_SETUP))  # its autoscaler, by default
    _states: dict[int, AutoscalerState] = field(default_factory=dict)
    _starts: dict[int, float] = field(default_factory=dict)  # replica workload id -> when it was asked for
    start_seconds: dict[int, float] = field(default_factory=dict)  # model id -> how long its last replica took to serve
    _health: dict[int, HealthTracker] = field(default_factory=dict)

    def tick(self, now_s: float) -> None:
        models = self.plane.models()
        replicas = self.plane.replicas(models)
        for model in models:
            try:
                self._reconcile(model, replicas.get(model.id, []), now_s)
            except Exception:  # one model's trouble must not stop the others'
                log.exception("serving controller: model %s", model.key)
        for gone in self._states.keys() - {m.id for m in models}:
            del self._states[gone]
        for gone in self._health.keys() - {m.id for m in models}:
            del self._health[gone]
        if self.sinks:
            replicas = self.plane.replicas(models)  # after this tick's starts and stops
            for sink in self.sinks:
                sink.publish(models, replicas)

    def _reconcile(self, model: DeployedModel, everyone: list[ReplicaView], now_s: float) -> None:
        replicas = [r for r in everyone if not r.stopping]
        health = self._health.setdefault(model.id, HealthTracker())
        ends = [self.plane.replica_end(i) for i in health.vanished(r.workload_id for r in everyone)]
        health.ended([end for end in ends if end is not None], now_s)
        if model.deleting:
            for replica in replicas:
                self._stop(health, replica.workload_id)
            if not everyone:
                self.plane.forget(model)
            return
        ready = self._ready(replicas)
        health.ready(sum(r.running for r in replicas) if ready is None else ready)
        self._time_starts(model, replicas, now_s)
        desired = self.desired(model, replicas, now_s)
        for _ in range(desired - len(replicas)):
            if not health.may_start(now_s):
                break  # backing off after failures
            try:
                started = self.plane.start_replica(model)
                health.known.add(started)
                self._starts[started] = now_s
            except Exception as exc:  # e.g. no interpreter the tenant's user may run: a failure, said once
                log.warning("model %s: cannot start a replica: %s", model.key, exc)
                health.failed(f"cannot start a replica: {exc}", now_s)
                break
        if len(replicas) > desired:
            surplus = sorted(replicas, key=lambda r: (r.running, -r.workload_id))[: len(replicas) - desired]
            for replica in surplus:
                self._stop(health, replica.workload_id)
        self.plane.record_desired(model, desired)
        self.plane.record_health(model, health.health(ready, now_s))

    def _stop(self, health: HealthTracker, workload_id: int) -> None:
        health.stopped.add(workload_id)
        self.plane.stop_replica(workload_id)

    def _ready(self, replicas: list[ReplicaView]) -> int | None:
        """Replicas the gateway has proven ready (None without a gateway)."""
        if self.readiness is None:
            return None
        return sum(self.readiness(r.workload_id, r.attempt) for r in replicas if r.running)

    def _time_starts(self, model: DeployedModel, replicas: list[ReplicaView], now_s: float) -> None:
        """How long the model's replicas take from being asked for to serving (the gateway's proof, or running
        without a gateway): whether it may scale to zero (``zero_ok``)."""
        for r in replicas:
            asked_s = self._starts.get(r.workload_id)
            if asked_s is None or not r.running:
                continue
            if self.readiness is None or self.readiness(r.workload_id, r.attempt):
                self.start_seconds[model.id] = now_s - self._starts.pop(r.workload_id)
        if len(self._starts) > 10_000:  # replicas that never served (cancelled, failed): forget the oldest
            for workload_id in sorted(self._starts)[:5_000]:
                del self._starts[workload_id]

    def desired(self, model: DeployedModel, replicas: list[ReplicaView], now_s: float) -> int:
        """The autoscaler's decision for ``model`` now (``serving.policies.autoscaler``, as the twin's ``Scaler``
        asks it): a fixed number (at least one) for a model without one."""
        demand = self.demand.take_demand(model.key)
        name = model_autoscaler(self.setup, model.autoscaler)
        if name is None:
            return max(model.min_replicas, 1)
        ready = sum(r.running for r in replicas)
        idle_s = now_s - demand.last_request_s if demand.last_request_s is not None else model.idle_timeout_s + 1
        start_s = self.start_seconds.get(model.id)
        signals = ModelSignals(
            model=model.key,
            now_s=now_s,
            arrivals=demand.arrivals,
            queued=demand.queued + demand.held,
            in_flight=demand.in_flight + demand.held,
            ready=ready,
            starting=len(replicas) - ready,
            ttft_recent_s=demand.ttft_recent_s,
            tpot_recent_s=demand.tpot_recent_s,
            idle_s=idle_s,
            # as the twin judges it, on the start last measured (none yet: it may)
            zero_ok=start_s is None or start_s <= zero_budget_s(model),
        )
        state = self._states.setdefault(model.id, AutoscalerState())
        decision, self._states[model.id] = decide(signals, state, self.config(model, name, demand))
        return decision.desired

    def config(self, model: DeployedModel, name: str = "tessera", demand: Demand | None = None) -> AutoscalerConfig:
        """The autoscaler ``name``'s configuration (``serving.setups``; as ``sim.serving.scaling.autoscaler_config``)
        for ``model``: its bounds, its idle timeout as the grace before zero, this controller's tick. ``tessera``
        aims at the sequences a replica's KV cache holds at the model's mean footprint (``concurrency_target``, as
        the twin; the engine's default target while its replicas export no KV cache size); ``knative`` keeps its
        own target."""
        demand = demand or Demand()
        if name == "knative":
            config = knative_defaults()
        else:
            interactive = DEFAULT_SLO_TARGETS[SloClass.INTERACTIVE]
            target = self.targets.get(model.engine, 8.0)
            if demand.kv_tokens_per_replica > 0:
                held = sequences_held(demand.kv_tokens_per_replica, self.setup.sizing, demand.tokens_per_sequence)
                target = float(round(held)) or 1.0
            config = tessera_defaults(interactive.ttft_s, interactive.tpot_s, target_concurrency=target)
        return dataclasses.replace(
            config,
            scale_to_zero_grace_s=model.idle_timeout_s,
            min_replicas=model.min_replicas,
            max_replicas=max(model.max_replicas, model.min_replicas, 1),
            metrics_interval_s=self.tick_s,
        )


def zero_budget_s(model: DeployedModel) -> float:
    """A model may scale to zero only when a replica comes back within half its class's TTFT target (the other half
    is left for queueing and prefill), as in the twin (whose requests are judged on the interactive class's)."""
    return DEFAULT_SLO_TARGETS[SloClass.parse(model.slo)].ttft_s / 2
