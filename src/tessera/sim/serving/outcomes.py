"""What the serving twin measures per request and per model, folded into a ``PolicyRun`` at the end.

A request **meets its SLO** when it was served with TTFT <= its class's TTFT target and TPOT <= its class's TPOT
target; a dropped (refused or shed) request misses it. Attainment is the share of a model's requests that met it.
"""

from __future__ import annotations

import numpy as np

from tessera.serving.policies.engine_parts import Completion
from tessera.serving.policies.requests import InferenceRequest, SloClass, SloTarget
from tessera.serving.policies.slo_feedback import RecentLatency
from tessera.sim.serving.fleet import Fleet
from tessera.sim.serving.result import ModelOutcome, PolicyRun


class ModelStats:
    __slots__ = ("model", "requests", "dropped", "met", "ttft", "tpot", "drop_reasons")

    def __init__(self, model: str) -> None:
        self.model = model
        self.requests = 0
        self.dropped = 0
        self.met = 0
        self.ttft: list[float] = []
        self.tpot: list[float] = []
        self.drop_reasons: dict[str, int] = {}

    def outcome(self) -> ModelOutcome:
        return ModelOutcome(
            model=self.model,
            requests=self.requests,
            served=len(self.ttft),
            dropped=self.dropped,
            slo_met=self.met,
            ttft_p99_s=p99(self.ttft),
            tpot_p99_s=p99(self.tpot),
        )


class Outcomes:
    def __init__(self, models: list[str], targets: dict[SloClass, SloTarget]) -> None:
        self.stats = {m: ModelStats(m) for m in models}
        self.targets = targets
        self.latency = RecentLatency(targets)  # the autoscaler's SLO feedback, as the live gateway keeps it

    def arrived(self, request: InferenceRequest) -> None:
        self.stats[request.model].requests += 1

    def served(self, c: Completion) -> None:
        stats = self.stats[c.request.model]
        if c.refused:
            self.dropped(c.request, c.refused)
            return
        ttft, tpot = c.ttft_s, c.tpot_s
        stats.ttft.append(ttft)
        stats.tpot.append(tpot)
        target = self.targets[c.request.slo]
        if ttft <= target.ttft_s and tpot <= target.tpot_s:
            stats.met += 1
        self.latency.served(c.request.model, c.finish_s, c.request.slo, ttft, tpot)

    def dropped(self, request: InferenceRequest, reason: str) -> None:
        stats = self.stats[request.model]
        stats.dropped += 1
        key = reason.split(":")[0]
        stats.drop_reasons[key] = stats.drop_reasons.get(key, 0) + 1

    def policy_run(
        self,
        policy: str,
        seed: int,
        fleet: Fleet,
        cold_starts: int,
        samples: np.ndarray,
        sample_s: float,
        wall_s: float,
    ) -> PolicyRun:
        """The run's result; ``samples`` rows are (time, GPUs in use, arrivals in the interval before)."""
        outcomes = [s.outcome() for s in self.stats.values()]
        requests = sum(o.requests for o in outcomes)
        met = sum(o.slo_met for o in outcomes)
        ttft = self.all_ttft()
        return PolicyRun(
            policy=policy,
            seed=seed,
            gpus=fleet.total_gpus,
            gpu_hours=fleet.gpu_seconds / 3600.0,
            peak_gpus=fleet.peak_gpus,
            requests=requests,
            dropped=sum(o.dropped for o in outcomes),
            cold_starts=cold_starts,
            slo_attainment_pct=100.0 * met / requests if requests else 100.0,
            worst_model_slo_attainment_pct=min((o.slo_attainment_pct for o in outcomes if o.requests), default=100.0),
            ttft_p99_s=p99(ttft),
            tpot_p99_s=p99(self.all_tpot()),
            sim_wall_s=wall_s,
            models=tuple(outcomes),
            times_s=samples[:, 0].copy(),
            gpus_in_use=samples[:, 1].copy(),
            arrival_rate=samples[:, 2] / sample_s,
            ttft_s=ttft,
        )

    def all_ttft(self) -> np.ndarray:
        return np.concatenate([np.asarray(s.ttft, dtype=np.float64) for s in self.stats.values()] or [np.zeros(0)])

    def all_tpot(self) -> np.ndarray:
        return np.concatenate([np.asarray(s.tpot, dtype=np.float64) for s in self.stats.values()] or [np.zeros(0)])


def p99(values: list[float] | np.ndarray) -> float:
    return float(np.percentile(values, 99)) if len(values) else 0.0
