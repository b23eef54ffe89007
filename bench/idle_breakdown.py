"""Where the idle GPU capacity sits when the arrived GPU request reaches a share of the cluster's capacity.

Usage: python bench/idle_breakdown.py [--pods openb_pod_list_default] [--policy tessera] [--seed 42] [--at 1.0]
       [--packing]

Replays the inflation experiment's arrival sequence up to ``--at`` x capacity and prints the idle GPUs by kind:
on nodes whose CPU is exhausted, whole free GPUs, and partly used GPUs by free-share bucket, plus the most common
leftover shares. ``--packing`` adds the GPUs holding sharing pods by what they hold (the most idle first) and how
many GPUs the bin-packing LP needs for the same shares (``gap_prices.packing_lp``, integrality relaxed: a lower
bound for any packing of them, in any order). Reads ../shared/traces by path.
"""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path

import numpy as np

from tessera.core.cluster import ClusterState
from tessera.core.fragmentation import TypicalPod, typical_pods
from tessera.core.gap_prices import packing_lp
from tessera.core.placement import Placer, make_policy
from tessera.sim.placement_study.inflation import inflate_requests
from tessera.sim.placement_study.inputs import load_inputs

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "traces"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", default="openb_pod_list_default")
    parser.add_argument("--policy", default="tessera")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--at", type=float, default=1.0)
    parser.add_argument("--packing", action="store_true", help="also the shared GPUs' contents against the LP")
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
    shares_on: dict[tuple[int, int], list[int]] = {}  # (node, GPU) -> the shares of the sharing pods on it
    arrived = 0
    for request in arrivals:
        placement = placer.decide(request, rng)
        arrived += request.total_gpu_milli
        if placement is None:
            failed[request.kind] += 1
        else:
            state.bind(placement)
            if len(placement.gpu_indices) == 1 and placement.gpu_milli_each < 1000:
                shares_on.setdefault((placement.node, placement.gpu_indices[0]), []).append(placement.gpu_milli_each)
        if arrived >= args.at * capacity:
            break
    report(state, typical, failed)
    if args.packing:
        report_packing(state, shares_on)


def report(state: ClusterState, typical: tuple[TypicalPod, ...], failed: Counter[str]) -> None:
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


def report_packing(state: ClusterState, shares_on: dict[tuple[int, int], list[int]]) -> None:
    idle: Counter[tuple[int, ...]] = Counter()
    gpus: Counter[tuple[int, ...]] = Counter()
    for (node, gpu), shares in shares_on.items():
        contents = tuple(sorted(shares, reverse=True))
        gpus[contents] += 1
        idle[contents] += int(state.gpu_free_milli[node, gpu])
    print("  GPUs holding sharing pods, by contents (GPUs, idle GPUs):")
    for contents, milli in idle.most_common(8):
        print(f"    {'+'.join(map(str, contents)):20s} {gpus[contents]:6d} {milli / 1000:8.1f}")
    placed = Counter(share for shares in shares_on.values() for share in shares)
    volume = sum(share * count for share, count in placed.items()) / 1000
    _, fewest = packing_lp({share: float(count) for share, count in placed.items()})
    print(
        f"  sharing pods: {volume:.1f} GPUs of requests on {len(shares_on)} GPUs ({len(shares_on) - volume:.1f} idle); "
        f"the LP packs them into {fewest:.1f} GPUs ({fewest - volume:.1f} idle)"
    )


if __name__ == "__main__":
    main()
