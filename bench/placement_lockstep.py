"""Placement speed of two policies in CPU time, deciding arrival by arrival in lockstep: one JSON line.

``bench_placement.py`` times each policy's whole run in wall-clock time, one policy after the other, so on a
shared machine a burst of other work lands on one policy and not the other. Here both policies replay the same
inflated arrival sequence (``inflation.run_inflation``'s seeded order, each on its own cluster state), taking turns
arrival by arrival (alternating which goes first), and each decision is timed in the thread's CPU time
(``time.thread_time_ns``): the ratio then holds under load, where wall-clock figures do not.
Usage: ``python bench/placement_lockstep.py [--policies tessera,fgd] [--seed N]``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from tessera.core.cluster import ClusterState
from tessera.core.fragmentation import typical_pods
from tessera.core.placement import Placer, TieBreak, make_policy
from tessera.core.workload import MILLI_PER_GPU
from tessera.sim.placement_study.inflation import inflate_requests
from tessera.sim.placement_study.inputs import default_inputs, load_inputs

OPENB = Path(__file__).resolve().parents[1].parent / "shared" / "traces" / "openb"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policies", default="tessera,fgd")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--inflate", type=float, default=1.3)
    args = parser.parse_args()
    nodes_csv, pods_csv = OPENB / "openb_node_list_gpu_node.csv", OPENB / "openb_pod_list_default.csv"
    inputs = load_inputs(nodes_csv, pods_csv) if nodes_csv.is_file() else default_inputs()
    names = args.policies.split(",")
    runs = []
    for name in names:
        rng = np.random.default_rng(args.seed)  # the same draws as run_inflation: arrivals, then node order
        capacity = sum(n.gpu_count for n in inputs.nodes) * MILLI_PER_GPU
        arrivals = inflate_requests(inputs.requests, capacity, args.inflate, rng)
        by_name = sorted(inputs.nodes, key=lambda n: n.name)
        state = ClusterState([by_name[i] for i in rng.permutation(len(by_name))])
        policy = make_policy(name, typical_pods(inputs.requests), state.model_names)
        runs.append((name, Placer(state, policy, TieBreak.FIRST), state, rng, arrivals, np.zeros(len(arrivals))))
    for i in range(len(runs[0][4])):
        for _, placer, state, rng, arrivals, spent in runs if i % 2 == 0 else runs[::-1]:
            started = time.thread_time_ns()
            placement = placer.decide(arrivals[i], rng)
            spent[i] = time.thread_time_ns() - started
            if placement is not None:
                state.bind(placement)
    result: dict[str, object] = {"trace": inputs.trace, "nodes": len(inputs.nodes), "pods": len(runs[0][4])}
    for name, *_, spent in runs:
        result[name] = {
            "cpu_pods_per_s": round(spent.size / (spent.sum() / 1e9), 1),
            "p99_decision_ms": round(float(np.percentile(spent, 99)) / 1e6, 4),
        }
    totals = [run[5].sum() for run in runs]
    if len(runs) == 2:
        result[f"{names[0]}_over_{names[1]}"] = round(float(totals[1] / totals[0]), 3)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
