"""Placement speed on the inflated arrival sequence: pods per second and the 99th-percentile decision time.

``tessera bench placement`` and ``bench/bench_placement.py`` call ``measure_placement``; the numbers come from the
per-arrival decision timings that ``run_inflation`` records, so they time the placement engine alone (not the
fragmentation sampling of the experiment).
"""

from __future__ import annotations

from typing import TypedDict

import numpy as np

from tessera.sim.placement_study.inflation import run_inflation
from tessera.sim.placement_study.inputs import ExperimentInputs


class PlacementBench(TypedDict):
    policy: str
    nodes: int
    pods: int  # arrivals of the inflated sequence
    pods_per_s: float  # arrivals / total decision seconds
    p99_decision_ms: float  # 99th percentile of the per-arrival decision times


def measure_placement(inputs: ExperimentInputs, policy: str, seed: int = 42, inflate: float = 1.3) -> PlacementBench:
    """One run of ``policy`` on ``inputs`` with the decision timings reduced to the bench line's figures."""
    samples = run_inflation(inputs.nodes, inputs.requests, policy, seed, inflate)
    total_s = float(samples.decision_s.sum())
    p99_s = float(np.percentile(samples.decision_s, 99)) if samples.arrivals else 0.0
    return PlacementBench(
        policy=policy,
        nodes=len(inputs.nodes),
        pods=samples.arrivals,
        pods_per_s=round(samples.arrivals / total_s, 1) if total_s > 0 else 0.0,
        p99_decision_ms=round(p99_s * 1000.0, 4),
    )
