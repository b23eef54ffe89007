"""Tessera placement variants side by side on a few traces and seeds (for designing the policy).

Usage: python bench/tessera_variants.py --variants base,strand=cpu_stranding_weight:3 [--traces default,cpu250]
       [--seeds 42-43] [--jobs 2] [--online]

A variant is ``label`` (the default parameters) or ``label=field:value;field:value`` with ``TesseraParams`` fields.
Prints mean unallocated GPU % at arrived 100% and 130% per trace and variant, and the mean relative reduction
against FGD's published mean.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import tessera.sim.placement_study.inflation as inflation
from tessera.core.fragmentation import TypicalPod
from tessera.core.placement.base import PlacementPolicy
from tessera.core.placement.tessera import TesseraParams, TesseraPolicy
from tessera.sim.placement_study.inflation import bucketize, run_inflation
from tessera.sim.placement_study.inputs import load_inputs
from tessera.sim.placement_study.published import load_published
from tessera.sim.placement_study.sweep import parse_seeds

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "traces"
BUCKETS = (100, 130)


def parse_variant(text: str) -> tuple[str, TesseraParams]:
    label, _, spec = text.partition("=")
    fields = {f.name: f.type for f in dataclasses.fields(TesseraParams)}
    values: dict[str, object] = {}
    for item in filter(None, spec.split(";")):
        key, _, value = item.partition(":")
        kind = fields[key]
        values[key] = (value == "1") if kind in ("bool", bool) else type(getattr(TesseraParams(), key))(value)
    return label, TesseraParams(**values)  # type: ignore[arg-type]


def one_run(task: tuple[str, str, str, int, bool]) -> tuple[str, str, int, tuple[float, ...]]:
    trace, label, spec, seed, online = task
    _, params = parse_variant(spec)

    def factory(
        name: str, typical: Sequence[TypicalPod] = (), model_names: Sequence[str] = (), **_kw: object
    ) -> PlacementPolicy:
        return TesseraPolicy(typical, model_names, online=online, params=params)

    inflation.make_policy = factory  # type: ignore[attr-defined]  # the name inflation imported from placement
    inputs = load_inputs(SHARED / "openb" / "openb_node_list_gpu_node.csv", SHARED / "openb" / f"{trace}.csv")
    curves = bucketize(run_inflation(inputs.nodes, inputs.requests, label, seed))
    return trace, label, seed, tuple(curves.unallocated_pct(b) for b in BUCKETS)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", default="base")
    parser.add_argument("--traces", default="default,cpu250,gpushare40")
    parser.add_argument("--seeds", default="42-43")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--online", action="store_true")
    args = parser.parse_args()
    published = load_published(SHARED / "fgd-results" / "analysis_allo_discrete.csv")
    variants = [v.strip() for v in args.variants.split(",")]
    labels = [v.partition("=")[0] for v in variants]
    traces = [f"openb_pod_list_{t}" for t in args.traces.split(",")]
    tasks = [
        (t, v.partition("=")[0], v, s, args.online) for t in traces for v in variants for s in parse_seeds(args.seeds)
    ]
    with ProcessPoolExecutor(args.jobs) as pool:
        results = list(pool.map(one_run, tasks))
    rel: dict[str, list[float]] = {label: [] for label in labels}
    print("| trace | arrived | FGD pub | " + " | ".join(labels) + " |")
    for trace in traces:
        for i, b in enumerate(BUCKETS):
            pub = published[(trace, "fgd")].mean(b)
            cells = []
            for label in labels:
                value = statistics.mean(r[3][i] for r in results if r[0] == trace and r[1] == label)
                rel[label].append(100.0 * (pub - value) / pub)
                cells.append(f"{value:.3f} ({rel[label][-1]:+.1f}%)")
            print(f"| {trace.removeprefix('openb_pod_list_')} | {b}% | {pub:.2f} | " + " | ".join(cells) + " |")
    print("| mean rel | | | " + " | ".join(f"{statistics.mean(rel[label]):+.2f}%" for label in labels) + " |")


if __name__ == "__main__":
    main()
