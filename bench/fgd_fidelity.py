"""Reproduce the FGD study on every openb trace with published results and compare with the published means.

Usage: python bench/fgd_fidelity.py [--traces default,cpu050] [--seeds 42-51] [--jobs 2] [--out FILE.md]

Reads ../shared/traces/openb and ../shared/traces/fgd-results by path. Prints one line per (trace, policy) and
writes a Markdown table. Exit code 1 when a value falls outside its acceptance band.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from tessera.core.placement import FGD_STUDY_POLICIES
from tessera.sim.placement_study.inputs import load_inputs
from tessera.sim.placement_study.published import FidelityRow, fidelity_tolerance_pp, load_published
from tessera.sim.placement_study.sweep import parse_seeds, run_sweep

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "traces"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", default="", help="comma-separated suffixes, e.g. default,cpu050 (default: all)")
    parser.add_argument("--seeds", default="42-51")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    published = load_published(SHARED / "fgd-results" / "analysis_allo_discrete.csv")
    traces = sorted({trace for trace, _ in published})
    if args.traces:
        wanted = {f"openb_pod_list_{t}" for t in args.traces.split(",")}
        traces = [t for t in traces if t in wanted]
    seeds = parse_seeds(args.seeds)
    rows: list[FidelityRow] = []
    for trace in traces:
        started = time.perf_counter()
        inputs = load_inputs(SHARED / "openb" / "openb_node_list_gpu_node.csv", SHARED / "openb" / f"{trace}.csv")
        results = run_sweep(inputs.nodes, inputs.requests, FGD_STUDY_POLICIES, seeds, 1.3, args.jobs)
        for policy in FGD_STUDY_POLICIES:
            runs = [r for r in results if r.policy == policy]
            for bucket in (100, 130):
                ours = statistics.mean(r.curves.unallocated_pct(bucket) for r in runs)
                rows.append(FidelityRow(trace, policy, bucket, published[(trace, policy)].mean(bucket), ours))
        print(f"{trace}: {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
    table = render(rows)
    print(table)
    if args.out:
        args.out.write_text(table)
    outside = [r for r in rows if abs(r.diff) > fidelity_tolerance_pp(r.trace, r.policy)]
    for row in outside:
        print(f"OUTSIDE BAND: {row}", file=sys.stderr)
    return 1 if outside else 0


def render(rows: list[FidelityRow]) -> str:
    lines = [
        "| trace | policy | published @100 | ours @100 | diff | published @130 | ours @130 | diff | band |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    by_key = {(r.trace, r.policy, r.bucket): r for r in rows}
    for trace, policy in dict.fromkeys((r.trace, r.policy) for r in rows):
        a, b = by_key[(trace, policy, 100)], by_key[(trace, policy, 130)]
        lines.append(
            f"| {trace.removeprefix('openb_pod_list_')} | {policy} | {a.published:.2f} | {a.ours:.2f} | {a.diff:+.2f} "
            f"| {b.published:.2f} | {b.ours:.2f} | {b.diff:+.2f} | ±{fidelity_tolerance_pp(trace, policy):.1f} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
