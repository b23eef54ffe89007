"""The twin's side of autoscaling: the signals each model's autoscaler sees, and its decision as a replica count.

The decision itself is ``tessera.serving.policies.autoscaler.decide`` (pure, shared with the live controller);
this module only gathers its inputs from the twin's replicas and measurements. ``zero_ok`` (may the model go to
zero?) is judged here: a model may scale to zero only when a replica can come back from the warm tier within half
of the interactive TTFT target (the other half is left for queueing and prefill).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from tessera.serving.policies.admission import HoldQueue, held_count
from tessera.serving.policies.autoscaler import (
    AutoscalerConfig,
    AutoscalerState,
    ModelSignals,
    ScaleDecision,
    decide,
    knative_defaults,
    tessera_defaults,
)
from tessera.serving.policies.model_cache import Tier, ready_time_s
from tessera.serving.policies.requests import SloClass, SloTarget
from tessera.serving.setups import PolicySetup
from tessera.serving.sizing import concurrency_target
from tessera.sim.serving.fleet import Replica, ReplicaState
from tessera.sim.serving.runtime import ModelRuntime


def autoscaler_config(setup: PolicySetup, targets: dict[SloClass, SloTarget]) -> AutoscalerConfig:
    if setup.autoscaler == "knative":
        config = knative_defaults()
    elif setup.autoscaler == "tessera":
        interactive = targets[SloClass.INTERACTIVE]
        config = tessera_defaults(ttft_target_s=interactive.ttft_s, tpot_target_s=interactive.tpot_s)
    else:
        raise ValueError(f"unknown autoscaler {setup.autoscaler!r}")
    return dataclasses.replace(config, metrics_interval_s=setup.tick_s)


class Scaler:
    def __init__(self, setup: PolicySetup, targets: dict[SloClass, SloTarget]) -> None:
        self.config = autoscaler_config(setup, targets)
        self.states: dict[str, AutoscalerState] = {}
        self.configs: dict[tuple[str, int, int], AutoscalerConfig] = {}
        self.sizing = setup.sizing
        # Tessera sizes each model's target by what its replica's KV cache holds; Knative keeps its one default.
        self.per_replica_target = setup.autoscaler == "tessera"
        self.zero_budget_s = targets[SloClass.INTERACTIVE].ttft_s / 2
        self._zero_ok_cache: dict[tuple[str, int], bool] = {}
        # each model's last call: what the autoscaler saw, how it was configured, what it decided (for comparisons
        # with the live controller, which must decide the same on the same signals)
        self.last: dict[str, tuple[ModelSignals, AutoscalerConfig, ScaleDecision]] = {}

    def _zero_ok(self, m: ModelRuntime) -> bool:
        """Whether a replica of ``m``'s current size comes back from the warm tier within the zero budget."""
        key = (m.name, m.size)
        ok = self._zero_ok_cache.get(key)
        if ok is None:
            ok = self._zero_ok_cache[key] = (
                ready_time_s(m.spec.weights_bytes, Tier.WARM, gpus=m.shape.gpus) <= self.zero_budget_s
            )
        return ok

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
        """Replicas of ``m``'s current size wanted now; ``counted`` are those replicas, ``loaded`` every replica
        whose load counts (all that are not draining)."""
        queued = in_flight = 0
        for r in loaded:
            if r.state is ReplicaState.READY:
                load = r.engine.load()
                queued += load.queued
                in_flight += load.queued + load.running
        ready = sum(r.state is ReplicaState.READY for r in counted)
        held = held_count(hold_queue, m.name) + len(m.gateway)
        if m.gateway.entries:  # a request still waiting for a replica is a leading sign of a slow first token
            waited = now_s - min(r.arrival_s for _, r in m.gateway.entries)
            ttft_s = waited if ttft_s is None else max(ttft_s, waited)
        signals = ModelSignals(
            model=m.name,
            now_s=now_s,
            arrivals=m.arrivals,
            queued=queued + held,
            in_flight=in_flight + held,
            ready=ready,
            starting=len(counted) - ready,
            ttft_recent_s=ttft_s,
            tpot_recent_s=tpot_s,
            idle_s=now_s - m.last_arrival_s,
            zero_ok=self._zero_ok(m),
        )
        state = self.states.setdefault(m.name, AutoscalerState())
        target = concurrency_target(m.shape, self.sizing, m.tokens_per_sequence) if self.per_replica_target else 0.0
        key = (m.name, m.size, round(target))
        config = self.configs.get(key)
        if config is None:
            config = self.config
            if self.per_replica_target:
                config = dataclasses.replace(config, target_concurrency=float(round(target)) or 1.0)
            self.configs[key] = config
        decision, self.states[m.name] = decide(signals, state, config)
        self.last[m.name] = (signals, config, decision)
        return decision.desired
