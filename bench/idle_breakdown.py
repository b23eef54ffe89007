"""Where the idle GPU capacity sits when the arrived GPU request reaches a share of the cluster's capacity.

Usage: python bench/idle_breakdown.py [--pods openb_pod_list_default] [--policy tessera] [--seed 42] [--at 1.0]

Replays the inflation experiment's arrival sequence up to ``--at`` x capacity and prints the idle GPUs by kind:
on nodes whose CPU is exhausted, whole free GPUs, and partly used GPUs by free-share bucket, plus the most common
leftover shares. Reads ../shared/traces by path.
"""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path

import numpy as np

from tessera.core.cluster import ClusterState
from tessera.core.fragmentation import typical_pods
from tessera.core.placement import Placer, make_policy
from tessera.sim.inflation import inflate_requests
from tessera.sim.inputs import load_inputs

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "traces"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", default="openb_pod_list_default")
    parser.add_argument("--policy", default="tessera")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--at", type=float, default=1.0)
    args = parser.parse_args()
    inputs = load_inputs(SHARED / "openb" / "openb_node_list_gpu_node.csv", SHARED / "openb" / f"{args.pods}.csv")
    rng = np.random.default_rng(args.seed)
    capacity = inputs.gpus * 1000
    arrivals = inflate_requests(inputs.requests, capacity, 1.3, rng)
    by_name = sorted(inputs.nodes, key=lambda n: n.name)
    state = ClusterState([by_name[i] for i in rng.permutation(len(by_name))])  # as run_inflation orders them
    typical = typical_pods(inputs.requests)
    placer = Placer(state, make_policy(args.policy, typical, state.model_names))
    failed: Counter[str] = Counter()
    arrived = 0
    for request in arrivals:
        placement = placer.decide(request, rng)
        arrived += request.total_gpu_milli
        if placement is None:
            failed[request.kind] += 1
        else:
            state.bind(placement)
        if arrived >= args.at * capacity:
            break
    report(state, typical, failed)


def report(state: ClusterState, typical: tuple, failed: Counter[str]) -> None:
    min_cpu = min(p.cpu_milli for p in typical if p.num_gpus > 0)
    buckets: Counter[str] = Counter()
    leftovers: Counter[int] = Counter()
    for node in range(state.num_nodes):
        for free in state.gpu_free_milli[node, : state.gpu_count[node]].tolist():
            if free == 0:
                continue
            if state.cpu_free_milli[node] < min_cpu:
                buckets["on nodes without CPU for any typical GPU pod"] += free
            elif free == 1000:
                buckets["whole free GPUs"] += free
            else:
                buckets[f"partly used, {free // 100 * 100}-{free // 100 * 100 + 99} milli free"] += free
                leftovers[free] += 1
    print(f"idle: {sum(buckets.values()) / 1000:.1f} GPUs; failed pods by kind: {dict(failed)}")
    for name, milli in buckets.most_common():
        print(f"  {name:55s} {milli / 1000:8.1f} GPUs")
    print("  most common leftover shares (milli: GPUs):", ", ".join(f"{m}: {n}" for m, n in leftovers.most_common(5)))


if __name__ == "__main__":
    main()
