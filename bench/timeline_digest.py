"""A fingerprint of every timeline replay, to show a refactoring changed no decision: one JSON line per (workload,
policy) with the table figures and a SHA-256 over every start decision (time, job, node, GPUs, share) and every
start and finish time.

Usage: python bench/timeline_digest.py [--workloads openb,training,tenants] [--seed 0] > digest.jsonl
Run it before and after a change and compare the files without the "wall_s" field (the replay's wall time).
Reads ../shared/traces by path (the openb default trace and node list; gavel/philly/pai for training).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

import numpy as np

from tessera.core.presets import PRESET_NAMES
from tessera.sim.replay.timeline import run_timeline
from tessera.sim.workloads.inputs import timeline_inputs

TRACES = Path(__file__).resolve().parents[1].parent / "shared" / "traces"
HOUR_S = 3600.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default="openb,training,tenants")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--traces", type=Path, default=TRACES, help="folder with openb/, gavel/, philly/, pai/")
    args = parser.parse_args()
    openb = args.traces / "openb"
    for workload in args.workloads.split(","):
        nodes = openb / "openb_node_list_gpu_node.csv" if workload == "openb" else None
        pods = openb / "openb_pod_list_default.csv" if workload == "openb" else None
        traces = args.traces if workload == "training" else None
        inputs = timeline_inputs(workload, nodes, pods, None, args.seed, traces)
        for policy in PRESET_NAMES:
            r = run_timeline(
                inputs.nodes,
                inputs.jobs,
                policy,
                args.seed,
                inputs.throughput,
                inputs.queues,
                colocation=inputs.colocation,
            )
            digest = hashlib.sha256()
            for start in r.starts:
                digest.update(repr((float(start.time_s), start.job_id, start.placements)).encode())
            digest.update(np.round(r.finish_s, 6).tobytes())
            digest.update(np.round(r.start_s, 6).tobytes())
            row = {
                "workload": workload,
                "policy": policy,
                "avg_jct_h": round(float(np.mean(r.jct_s)) / HOUR_S, 4),
                "preemptions": r.preemptions,
                "reclaims": r.reclaims,
                "shrunk_workers": r.shrunk_workers,
                "grown_workers": r.grown_workers,
                "alloc_pct": round(r.gpu_alloc_pct, 3),
                "shares": {q: round(s, 4) for q, s in r.queue_shares.items()},
                "unfinished": r.unfinished,
                "decisions_sha256": digest.hexdigest()[:16],
                "wall_s": round(r.wall_s, 1),
            }
            print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
