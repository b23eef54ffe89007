"""Tessera's placement policy against FGD on every openb trace with published results.

Usage: python bench/tessera_vs_fgd.py [--traces default,cpu050] [--seeds 42-51] [--jobs 2] [--out DIR]

Runs tessera (given the typical pods, as FGD is), tessera-online (learns them from arrivals), Tessera's fgd and
bestfit side by side in one run, and compares the mean unallocated GPU % at arrived 100% and 130% with the FGD
authors' published mean. Writes DIR/tessera-vs-fgd.md (table) and DIR/tessera-vs-fgd.png (fragmentation and
unallocated GPU % over arrivals on the default trace). Exit code 1 when an acceptance check fails.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from tessera.sim.placement_study.inputs import load_inputs  # noqa: E402
from tessera.sim.placement_study.published import load_published  # noqa: E402
from tessera.sim.placement_study.sweep import RunResult, parse_seeds, run_sweep  # noqa: E402

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "traces"
POLICIES = ("tessera", "tessera-online", "fgd", "bestfit")
BUCKETS = (100, 130)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", default="")
    parser.add_argument("--seeds", default="42-51")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path(".tessera/tessera-vs-fgd"))
    args = parser.parse_args()
    published = load_published(SHARED / "fgd-results" / "analysis_allo_discrete.csv")
    traces = sorted({trace for trace, _ in published})
    if args.traces:
        traces = [t for t in traces if t.removeprefix("openb_pod_list_") in args.traces.split(",")]
    seeds = parse_seeds(args.seeds)
    args.out.mkdir(parents=True, exist_ok=True)
    rows: list[Row] = []
    curves = {}
    for trace in traces:
        inputs = load_inputs(SHARED / "openb" / "openb_node_list_gpu_node.csv", SHARED / "openb" / f"{trace}.csv")
        results = run_sweep(inputs.nodes, inputs.requests, POLICIES, seeds, 1.3, args.jobs)
        mean = {(p, b): _mean(results, p, b) for p in POLICIES for b in BUCKETS}
        rows.append((trace, mean, {b: published[(trace, "fgd")].mean(b) for b in BUCKETS}))
        print(_row(*rows[-1]), flush=True)
        if trace == "openb_pod_list_default":
            curves = {p: [r for r in results if r.policy == p] for p in ("tessera", "fgd", "bestfit")}
    table = _table(rows)
    (args.out / "tessera-vs-fgd.md").write_text(table)
    print(table)
    if curves:
        _plot(curves, args.out / "tessera-vs-fgd.png")
    return 0 if _accepted(rows) else 1


def _mean(results: list[RunResult], policy: str, bucket: int) -> float:
    return statistics.mean(r.curves.unallocated_pct(bucket) for r in results if r.policy == policy)


# A trace's row: (trace, mean unallocated % per (policy, bucket), FGD's published mean per bucket).
Row = tuple[str, dict[tuple[str, int], float], dict[int, float]]


def _row(trace: str, mean: dict[tuple[str, int], float], pub: dict[int, float]) -> str:
    cells = [
        f"{b}%: tessera {mean[('tessera', b)]:.2f} online {mean[('tessera-online', b)]:.2f} "
        f"fgd(ours) {mean[('fgd', b)]:.2f} fgd(pub) {pub[b]:.2f}"
        for b in BUCKETS
    ]
    return f"{trace}: " + " | ".join(cells)


def _relative(ours: float, fgd: float) -> float:
    return 100.0 * (fgd - ours) / fgd


def _table(rows: list[Row]) -> str:
    lines = [
        "| trace | arrived | FGD published | fgd (Tessera's) | bestfit | **tessera** | vs published FGD "
        "| vs Tessera's fgd | tessera-online | online vs published FGD |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    rel, rel_online = [], []
    for trace, mean, pub in rows:
        for b in BUCKETS:
            t, o, f = mean[("tessera", b)], mean[("tessera-online", b)], mean[("fgd", b)]
            rel.append(_relative(t, pub[b]))
            rel_online.append(_relative(o, pub[b]))
            name, bestfit = trace.removeprefix("openb_pod_list_"), mean[("bestfit", b)]
            lines.append(
                f"| {name} | {b}% | {pub[b]:.2f} | {f:.2f} | {bestfit:.2f} | **{t:.2f}** | {rel[-1]:+.1f}% "
                f"| {_relative(t, f):+.1f}% | {o:.2f} | {rel_online[-1]:+.1f}% |"
            )
    lines.append(f"| **mean** | | | | | | **{np.mean(rel):+.1f}%** | | | **{np.mean(rel_online):+.1f}%** |")
    return "\n".join(lines) + "\n\n(relative: how much less unallocated GPU than FGD; positive is better)\n"


def _accepted(rows: list[Row]) -> bool:
    ok = True
    rel = []
    for trace, mean, pub in rows:
        for b in BUCKETS:
            if mean[("tessera", b)] > pub[b]:
                print(f"FAIL {trace} @{b}%: tessera {mean[('tessera', b)]:.2f} > FGD {pub[b]:.2f}", file=sys.stderr)
                ok = False
            rel.append(_relative(mean[("tessera", b)], pub[b]))
    print(f"mean relative reduction vs published FGD: {np.mean(rel):.1f}% (target >= 15%)", file=sys.stderr)
    return ok and float(np.mean(rel)) >= 15.0


def _plot(curves: dict[str, list[RunResult]], path: Path) -> None:
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    arrived = np.arange(131)
    for policy, runs in curves.items():
        frag = np.nanmean([r.curves.frag_pct for r in runs], axis=0)
        unalloc = 100.0 - np.nanmean([r.curves.alloc_pct for r in runs], axis=0)
        left.plot(arrived, frag, label=policy)
        right.plot(arrived[80:], unalloc[80:], label=policy)
    left.set(
        title="Fragmented GPU (FGD's measure)",
        xlabel="arrived GPU request (% of capacity)",
        ylabel="% of cluster GPU capacity",
    )
    right.set(title="Unallocated GPU", xlabel="arrived GPU request (% of capacity)", ylabel="% of capacity")
    for axis in (left, right):
        axis.grid(alpha=0.3)
        axis.legend()
    figure.suptitle("openb default trace, 1,213 nodes / 6,212 GPUs, mean of seeds")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


if __name__ == "__main__":
    sys.exit(main())
