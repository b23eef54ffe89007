"""The live controller decides what the twin decides: a short trace replayed through the twin (its ``tessera``
setup, as live runs it: no adaptive sizing, isolated sharing), and every scaling call it made replayed through the
live ``Controller`` (fake clock, in-memory plane) on what the gateway would report of the same state (in flight,
queued, recent TTFT/TPOT, the KV cache a replica exports, the model's footprint, its replicas' start time). The
live autoscaler must be configured as the twin's and take the same decision at every call, scale-ups from zero,
panics, SLO feedback and scale-downs included. Likewise every routing decision of a replay, given to the live
gateway's router feed (``LiveReplicas``) as the loads it would have scraped, picks the same replica."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import pytest

from tessera.core.cluster import NodeSpec
from tessera.serving.controller import Controller, Demand, ReplicaView
from tessera.serving.engines.base import EngineStats
from tessera.serving.gateway.registry import InMemoryRegistry, ModelRoute
from tessera.serving.gateway.replicas import LiveReplicas
from tessera.serving.policies.admission import HoldQueue
from tessera.serving.policies.autoscaler import AutoscalerConfig, ModelSignals, ScaleDecision
from tessera.serving.policies.model_cache import Tier, ready_time_s
from tessera.serving.policies.requests import SloClass, SloTarget
from tessera.serving.replicas import DeployedModel
from tessera.serving.setups import PolicySetup, serving_setup, with_setup_knobs
from tessera.serving.sizing import BLOCK_TOKENS
from tessera.sim.serving.fleet import Replica
from tessera.sim.serving.perf_choice import make_perf_factory
from tessera.sim.serving.runtime import ModelRuntime
from tessera.sim.serving.scaling import Scaler
from tessera.sim.serving.synthetic_trace import synthetic_llm_trace
from tessera.sim.serving.twin import Twin, TwinInputs
from tessera.sim.serving.workload import build_workload

Call = tuple[str, ModelSignals, AutoscalerConfig, ScaleDecision, int, float | None]


class RecordingScaler(Scaler):
    """The twin's scaler, noting each call with the KV tokens of the model's replica and its footprint then."""

    def __init__(self, setup: PolicySetup, targets: dict[SloClass, SloTarget]) -> None:
        super().__init__(setup, targets)
        self.calls: list[Call] = []

    def desired(
        self,
        m: ModelRuntime,
        counted: Sequence[Replica],
        loaded: Sequence[Replica],
        hold_queue: HoldQueue,
        now_s: float,
        ttft_s: float | None,
        tpot_s: float | None,
    ) -> int:
        out = super().desired(m, counted, loaded, hold_queue, now_s, ttft_s, tpot_s)
        signals, config, decision = self.last[m.name]
        self.calls.append((m.name, signals, config, decision, m.shape.kv_blocks * BLOCK_TOKENS, m.tokens_per_sequence))
        return out


def live_setup() -> PolicySetup:
    """The tessera setup as live runs it (no adaptive sizing; sim engines on simulated GPUs never slow each other)."""
    setup = with_setup_knobs(serving_setup("tessera"), ["sharing=isolated"])
    return dataclasses.replace(setup, sizing=dataclasses.replace(setup.sizing, adaptive=False))


@pytest.fixture(scope="module")
def twin_calls() -> tuple[list[Call], dict[str, float]]:
    trace = synthetic_llm_trace(0)
    workload = build_workload(trace, 3, 1.0, 0.4, 0)
    horizon = 900.0
    requests = [r for r in workload.requests if r.arrival_s < horizon]
    models = {m.name: m.spec for m in workload.models}
    nodes = [NodeSpec("node-000", 128_000, 2_048_000, 4, "H100-80GB")]
    setup = live_setup()
    twin = Twin(TwinInputs(requests, models, horizon, nodes, make_perf_factory()), setup)
    recording = twin.scaler = RecordingScaler(setup, twin.inputs.targets)
    twin.run()
    starts = {
        m.name: ready_time_s(m.spec.weights_bytes, Tier.WARM, gpus=m.spec.tensor_parallel) for m in workload.models
    }
    return recording.calls, starts


def test_the_live_controller_configures_and_decides_as_the_twin_at_every_call(
    twin_calls: tuple[list[Call], dict[str, float]],
) -> None:
    calls, starts = twin_calls
    names = sorted({name for name, *_ in calls})
    models = {
        name: DeployedModel(
            id=i + 1,
            name=name,
            tenant="t",
            queue="t",
            engine="sim",
            weights="",
            gpus=1,
            gpu_milli=0,
            gpu_mem_mib=0,
            min_replicas=0,
            max_replicas=1000,
            idle_timeout_s=30.0,
            slo="interactive",
        )  # fmt: skip
        for i, name in enumerate(names)
    }
    controller = Controller(plane=None, setup=live_setup())  # type: ignore[arg-type]  # desired() needs no plane
    for name, model in models.items():
        controller.start_seconds[model.id] = starts[name]  # the start the live replicas show, as the twin's warm one
    kinds: set[str] = set()
    for name, signals, twin_config, decision, kv_tokens, footprint in calls:
        model = models[name]
        demand = Demand(
            in_flight=signals.in_flight, queued=signals.queued, last_request_s=signals.now_s - signals.idle_s,
            ttft_recent_s=signals.ttft_recent_s, tpot_recent_s=signals.tpot_recent_s, tokens_per_sequence=footprint,
            kv_tokens_per_replica=kv_tokens,
        )  # fmt: skip
        controller.demand = _Fixed(demand)
        live_config = controller.config(model, "tessera", demand)
        assert live_config == twin_config, (name, signals.now_s)
        replicas = [ReplicaView(k, True, None) for k in range(signals.ready)]
        replicas += [ReplicaView(1000 + k, False, None) for k in range(signals.starting)]
        live = controller.desired(model, replicas, signals.now_s)
        assert live == decision.desired, (name, signals, decision)
        kinds.add(decision.reason)
    exercised = {"stable", "panic", "slo-feedback", "scale-down-delay"}  # what the replay must have gone through
    assert len(calls) > 500 and exercised <= kinds


class _Fixed:
    def __init__(self, demand: Demand) -> None:
        self.demand = demand

    def take_demand(self, model_key: str) -> Demand:
        return self.demand


@pytest.mark.parametrize("router", ["prefix-affinity", "least-load"])
def test_the_live_gateway_routes_as_the_twin_at_every_request(router: str) -> None:
    """Every routing decision of a short twin replay (its late binding's candidates, with the load the twin's
    engines showed) given to the live gateway's ``LiveReplicas`` as the loads it would have scraped: the same
    replica every time, for the setup's router and for least-load."""
    trace = synthetic_llm_trace(0)
    workload = build_workload(trace, 2, 1.0, 0.5, 1)
    requests = [r for r in workload.requests if r.arrival_s < 600.0]
    nodes = [NodeSpec("node-000", 128_000, 2_048_000, 4, "H100-80GB")]
    setup = dataclasses.replace(live_setup(), router=router)
    inputs = TwinInputs(requests, {m.name: m.spec for m in workload.models}, 600.0, nodes, make_perf_factory())
    twin = Twin(inputs, setup)
    twin.route_log = []
    twin.run()
    registry = InMemoryRegistry()
    live = LiveReplicas(registry)
    ids: dict[tuple[str, int], int] = {}  # (model, twin replica id) -> the live registry's
    prefix_hits = 0
    for request, views, chosen in twin.route_log:
        if registry.route(request.model) is None:
            registry.deploy(ModelRoute(request.model, "t", router=router))
        for view in views:
            if (request.model, view.replica) not in ids:
                ids[(request.model, view.replica)] = registry.add_replica(request.model, f"unix:/r/{view.replica}")
        offered = {ids[(request.model, v.replica)]: v for v in views}
        for load in live.loads(request.model):
            shown = offered.get(load.endpoint.replica)
            if shown is None:  # not a candidate of the twin's late binding now: it takes nothing
                load.unreachable_until_s = math.inf
                continue
            load.unreachable_until_s = 0.0
            load.scraped = EngineStats(
                running=shown.running, waiting=shown.queued, kv_cache_usage=1.0 - shown.kv_free_frac
            )
            load.inflight = load.inflight_at_scrape = 0
            load.inflight_tokens, load.inflight_prompt_tokens = shown.predicted_tokens, shown.prefill_tokens
        picked = live.pick(request, router, request.arrival_s)
        assert picked is not None and chosen is not None
        assert picked.endpoint.replica == ids[(request.model, chosen)], (request.id, router)
        prefix_hits += bool(request.prefix) and len(views) > 1
    assert len(twin.route_log) > 500 and prefix_hits > 50  # many decisions, many of them among several replicas
