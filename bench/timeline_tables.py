"""Re-run the timeline tables of docs/scheduling-over-time.md: one JSON line per (workload, seed, policy).

Usage: python bench/timeline_tables.py [--workloads openb,training,tenants] [--seeds 0] [--policies ...]
[--placements NAME,...]

Reads ../shared/traces by path (openb default trace and node list; gavel/philly/pai for training). Prints avg JCT,
p99 JCT, avg wait (hours), GPU allocation %, preemptions, reclaims, the longest reclaim latency and the longest time
blocked by borrowers, per-queue shares, the makespan and the replay's wall time. ``--placements`` runs each policy
once per placement named (``preset``: the preset's own), as ``tessera simulate timeline --placement`` does. Wall
times depend on the machine and its load; compare them only within one run.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from tessera.core.presets import PRESETS
from tessera.sim.replay.timeline import run_timeline
from tessera.sim.workloads.inputs import timeline_inputs

TRACES = Path(__file__).resolve().parents[1].parent / "shared" / "traces"
HOUR_S = 3600.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default="openb,training,tenants")
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--policies", default=",".join(PRESETS))
    parser.add_argument(
        "--placements", default="preset", help="placements to run each policy with; preset: the preset's own"
    )
    parser.add_argument("--traces", type=Path, default=TRACES, help="folder with openb/, gavel/, philly/, pai/")
    args = parser.parse_args()
    openb = args.traces / "openb"
    for workload in args.workloads.split(","):
        for seed in (int(s) for s in args.seeds.split(",")):
            nodes = openb / "openb_node_list_gpu_node.csv" if workload == "openb" else None
            pods = openb / "openb_pod_list_default.csv" if workload == "openb" else None
            traces = args.traces if workload == "training" else None
            inputs = timeline_inputs(workload, nodes, pods, None, seed, traces)
            for policy, placement in ((p, q) for p in args.policies.split(",") for q in args.placements.split(",")):
                r = run_timeline(
                    inputs.nodes,
                    inputs.jobs,
                    policy,
                    seed,
                    inputs.throughput,
                    inputs.queues,
                    colocation=inputs.colocation,
                    placement=None if placement == "preset" else placement,
                )
                row = {
                    "workload": workload,
                    "seed": seed,
                    "policy": r.policy,
                    "avg_jct_h": round(float(np.mean(r.jct_s)) / HOUR_S, 4),
                    "p99_jct_h": round(float(np.percentile(r.jct_s, 99)) / HOUR_S, 2),
                    "avg_wait_h": round(float(np.mean(r.wait_s)) / HOUR_S, 3),
                    "alloc_pct": round(r.gpu_alloc_pct, 1),
                    "makespan_h": round(float(r.finish_s.max() - r.arrival_s.min()) / HOUR_S, 1)
                    if r.jct_s.size
                    else 0.0,
                    "preemptions": r.preemptions,
                    "reclaims": r.reclaims,
                    "shrunk_workers": r.shrunk_workers,
                    "grown_workers": r.grown_workers,
                    "reclaim_latency_max_s": round(r.reclaim_latency_max_s, 1),
                    "blocked_by_borrowers_max_s": round(r.blocked_by_borrowers_max_s, 1),
                    "jain": round(r.jain_index, 3),
                    "shares": {q: round(s, 3) for q, s in r.queue_shares.items()},
                    "unfinished": r.unfinished,
                    "wall_s": round(r.wall_s, 1),
                }
                print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
