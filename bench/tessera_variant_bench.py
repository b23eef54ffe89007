"""tessera against Tessera's fgd on workload variants of the openb default pod list (``placement_study.variants``).

Usage: python bench/tessera_variant_bench.py [--set tuning|held-out|all] [--seeds 42-51] [--jobs 2] [--online]
       [--params field:value;field:value] [--out FILE] [--plot FILE.png]

For each variant, arrived 100% and 130% and the seeds, runs the arrival-inflation experiment (1.3x) with tessera
(``--params``: ``TesseraParams`` fields to change) and fgd, and prints mean unallocated GPU %, tessera's relative
reduction against fgd (positive: less unallocated), and whether any cell is worse than fgd. ``--online`` adds
tessera-online; ``--plot`` draws the reductions as bars. Exit code 1 when a cell is worse or the mean reduction is
below 15%.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

import tessera.sim.placement_study.inflation as inflation
from tessera.core.fragmentation import TypicalPod
from tessera.core.placement import make_policy
from tessera.core.placement.base import PlacementPolicy
from tessera.core.placement.tessera import TesseraParams, TesseraPolicy
from tessera.sim.placement_study.inflation import bucketize, run_inflation
from tessera.sim.placement_study.inputs import load_inputs
from tessera.sim.placement_study.sweep import parse_seeds
from tessera.sim.placement_study.variants import HELD_OUT, TUNING, VARIANTS, derive

OPENB = Path(__file__).resolve().parents[1].parent / "shared" / "traces" / "openb"
BUCKETS = (100, 130)


def parse_params(spec: str) -> TesseraParams:
    values: dict[str, object] = {}
    for item in filter(None, spec.split(";")):
        key, _, value = item.partition(":")
        default = getattr(TesseraParams(), key)
        values[key] = (value == "1") if isinstance(default, bool) else type(default)(value)
    return dataclasses.replace(TesseraParams(), **values)  # type: ignore[arg-type]


def one_run(task: tuple[str, str, int, str]) -> tuple[str, str, int, tuple[float, ...]]:
    variant, policy, seed, spec = task
    params = parse_params(spec)

    def factory(name: str, typical: Sequence[TypicalPod] = (), model_names: Sequence[str] = ()) -> PlacementPolicy:
        if name.startswith("tessera"):
            return TesseraPolicy(typical, model_names, online=name == "tessera-online", params=params)
        return make_policy(name, typical, model_names)

    inflation.make_policy = factory  # type: ignore[attr-defined,assignment]  # the name inflation imported from placement
    inputs = load_inputs(OPENB / "openb_node_list_gpu_node.csv", OPENB / "openb_pod_list_default.csv")
    requests = derive(VARIANTS[variant], inputs.requests, inputs.nodes)
    curves = bucketize(run_inflation(inputs.nodes, requests, policy, seed))
    return variant, policy, seed, tuple(curves.unallocated_pct(b) for b in BUCKETS)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", choices=("tuning", "held-out", "all"), default="tuning")
    parser.add_argument("--variants", default="", help="comma-separated variant names instead of --set")
    parser.add_argument("--seeds", default="42-43")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--online", action="store_true")
    parser.add_argument("--params", default="")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--plot", type=Path)
    args = parser.parse_args()
    chosen = {"tuning": TUNING, "held-out": HELD_OUT, "all": TUNING + HELD_OUT}[args.set]
    names = args.variants.split(",") if args.variants else [v.name for v in chosen]
    policies = ["tessera", "fgd"] + (["tessera-online"] if args.online else [])
    seeds = parse_seeds(args.seeds)
    tasks = [(v, p, s, args.params) for v in names for p in policies for s in seeds]
    with ProcessPoolExecutor(args.jobs) as pool:
        results = list(pool.map(one_run, tasks))

    def mean(variant: str, policy: str, i: int) -> float:
        return statistics.mean(r[3][i] for r in results if r[0] == variant and r[1] == policy)

    header = "| variant | set | arrived | fgd | tessera | reduction |" + (
        " online | reduction |" if args.online else ""
    )
    lines = [header, "|---|---|---:|---:|---:|---:|" + ("---:|---:|" if args.online else "")]
    rel: list[float] = []
    rel_online: list[float] = []
    worse: list[str] = []
    held = {v.name for v in HELD_OUT}
    for v in names:
        for i, b in enumerate(BUCKETS):
            f, t = mean(v, "fgd", i), mean(v, "tessera", i)
            rel.append(100.0 * (f - t) / f)
            if t > f:
                worse.append(f"{v}@{b}%")
            cells = f"| {v} | {'held-out' if v in held else 'tuning'} | {b}% | {f:.2f} | {t:.2f} | {rel[-1]:+.1f}% |"
            if args.online:
                o = mean(v, "tessera-online", i)
                rel_online.append(100.0 * (f - o) / f)
                cells += f" {o:.2f} | {rel_online[-1]:+.1f}% |"
            lines.append(cells)
    summary = f"| **mean** | | | | | **{statistics.mean(rel):+.1f}%** |"
    if args.online:
        summary += f" | **{statistics.mean(rel_online):+.1f}%** |"
    lines.append(summary)
    table = "\n".join(lines) + "\n"
    print(f"seeds {args.seeds}, params {args.params or 'default'}")
    print(table)
    print("cells worse than fgd: " + (", ".join(worse) if worse else "none"))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(table)
    if args.plot:
        _plot(names, rel, rel_online, held, args.plot)
    return 0 if not worse and statistics.mean(rel) >= 15.0 else 1


def _plot(names: list[str], rel: list[float], rel_online: list[float], held: set[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(11, 4.2))
    x = np.arange(len(names))
    for i, (b, shade) in enumerate(zip(BUCKETS, ("tab:blue", "tab:cyan"), strict=True)):
        axis.bar(x + (i - 0.5) * 0.38, rel[i :: len(BUCKETS)], 0.38, color=shade, label=f"tessera, arrived {b}%")
    if rel_online:
        for i in range(len(BUCKETS)):
            axis.scatter(
                x + (i - 0.5) * 0.38,
                rel_online[i :: len(BUCKETS)],
                color="black",
                s=12,
                zorder=3,
                label="tessera-online" if i == 0 else None,
            )
    axis.axhline(0, color="black", linewidth=0.8)
    axis.axhline(15, color="gray", linestyle="--", linewidth=0.8, label="15% target (mean)")
    axis.set_xticks(x, [n + (" *" if n in held else "") for n in names], rotation=30, ha="right")
    axis.set(ylabel="less unallocated GPU than fgd (%)", title="tessera vs fgd on workload variants (* held out)")
    axis.grid(axis="y", alpha=0.3)
    axis.legend(fontsize=8)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)
    plt.close(figure)


if __name__ == "__main__":
    sys.exit(main())
