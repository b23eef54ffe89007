"""Placement speed on the inflated arrival sequence: pods per second and the decision-time percentiles.

``tessera bench placement`` and ``bench/bench_placement.py`` call these. ``measure_placement`` (one policy) takes
the per-arrival decision timings that ``run_inflation`` records, so it times the placement engine alone (not the
fragmentation sampling of the experiment). ``compare_placement`` (several policies, in one process) replays the
same arrival sequence for each policy on its own cluster, in lockstep: arrival by arrival, each policy decides in
turn, the first to decide rotating from one arrival to the next, so that a burst of other work on the machine falls
on every policy alike rather than on whichever ran during it. Each decision is timed in wall-clock time, as in
``measure_placement``, and the decisions are the same as in a run of one policy (each has its own cluster state
and its own generator, seeded alike).

Building a policy is not a decision and is not timed as one, for any policy: fgd builds its fragmentation model,
tessera also solves its gap-price LP and loads (or, the first time on a machine, compiles) its numba kernels.
``compare_placement`` reports that time as ``setup_ms``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TypedDict

import numpy as np

from tessera.core.cluster import ClusterState
from tessera.core.fragmentation import typical_pods
from tessera.core.placement import Placer, TieBreak, make_policy
from tessera.core.workload import MILLI_PER_GPU
from tessera.sim.placement_study.inflation import inflate_requests, run_inflation
from tessera.sim.placement_study.inputs import ExperimentInputs


class PlacementBench(TypedDict):
    policy: str
    nodes: int
    pods: int  # arrivals of the inflated sequence
    pods_per_s: float  # arrivals / total decision seconds
    p99_decision_ms: float  # 99th percentile of the per-arrival decision times


class PlacementComparison(TypedDict):
    policy: str
    nodes: int
    pods: int  # arrivals of the inflated sequence
    pods_per_s: float  # arrivals / total decision seconds
    p50_decision_ms: float
    p99_decision_ms: float
    setup_ms: float  # building the policy (not in the decision times)
    baseline: str
    pods_per_s_ratio: float  # pods_per_s / the baseline's


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


def compare_placement(
    inputs: ExperimentInputs,
    policies: Sequence[str],
    seed: int = 42,
    inflate: float = 1.3,
    baseline: str | None = None,
) -> list[PlacementComparison]:
    """``policies`` in lockstep on ``inputs`` (see the module's docstring), one result each in the given order, with
    each one's pods/s over ``baseline``'s (default: the last policy)."""
    base = baseline if baseline is not None else policies[-1]
    if base not in policies:
        raise ValueError(f"baseline {base!r} is not among {list(policies)}")
    typical = typical_pods(inputs.requests)
    capacity_milli = sum(n.gpu_count for n in inputs.nodes) * MILLI_PER_GPU
    by_name = sorted(inputs.nodes, key=lambda n: n.name)
    runs = []
    arrivals = []
    for name in policies:
        rng = np.random.default_rng(seed)  # run_inflation's draws: the arrivals, then the node order
        arrivals = inflate_requests(inputs.requests, capacity_milli, inflate, rng)
        state = ClusterState([by_name[i] for i in rng.permutation(len(by_name))])
        started = time.perf_counter()
        policy = make_policy(name, typical, state.model_names)
        setup_s = time.perf_counter() - started
        runs.append((Placer(state, policy, TieBreak.FIRST), state, rng, setup_s))
    n, count = len(arrivals), len(runs)
    spent = np.zeros((count, n))
    for i, request in enumerate(arrivals):
        for turn in range(count):
            j = (i + turn) % count
            placer, state, rng, _ = runs[j]
            started = time.perf_counter()
            placement = placer.decide(request, rng)
            spent[j, i] = time.perf_counter() - started
            if placement is not None:
                state.bind(placement)
    totals = spent.sum(axis=1)
    speed = [n / float(total) if total > 0 else 0.0 for total in totals]
    base_speed = speed[list(policies).index(base)]
    results = []
    for j, name in enumerate(policies):
        p50, p99 = (float(np.percentile(spent[j], q)) * 1000.0 if n else 0.0 for q in (50, 99))
        results.append(
            PlacementComparison(
                policy=name,
                nodes=len(inputs.nodes),
                pods=n,
                pods_per_s=round(speed[j], 1),
                p50_decision_ms=round(p50, 4),
                p99_decision_ms=round(p99, 4),
                setup_ms=round(runs[j][3] * 1000.0, 1),
                baseline=base,
                pods_per_s_ratio=round(speed[j] / base_speed, 3) if base_speed > 0 else 0.0,
            )
        )
    return results
