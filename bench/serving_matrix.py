"""The serving study's acceptance matrix: every (models, zipf, load) combination, each policy on the smallest cluster
that meets the SLOs (``--gpus-for-slo``), over several seeds, side by side.

    .venv/bin/python bench/serving_matrix.py --trace ../shared/traces/azure-llm/AzureLLMInferenceTrace_conv.csv \
        --out .tessera/serving-matrix

Each combination's full report (summary.json, summary.md, plots) goes to ``OUT/n{N}-z{Z}-l{L}/``; ``OUT/matrix.md``
and ``OUT/matrix.png`` hold the table and the figure; the last line printed is one JSON object per combination.
A combination *passes* when, on every seed, tessera meets the SLOs for >= 99% of every model's requests with
nothing dropped and uses at least 40% fewer GPU-hours than static and fewer than static-autoscale.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from tessera.sim.placement_study.sweep import parse_seeds  # noqa: E402
from tessera.sim.serving.config import StudyConfig  # noqa: E402
from tessera.sim.serving.report import write_serving_report  # noqa: E402
from tessera.sim.serving.result import PolicyRun  # noqa: E402
from tessera.sim.serving.study import SLO_PCT, run_study  # noqa: E402

POLICIES = ("static", "static-autoscale", "tessera")
MIN_SAVING_PCT = 40.0


Row = dict[str, Any]  # one combination's summary, printed as a JSON line


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def run_combination(trace: Path, out: Path, models: int, zipf: float, load: float, seeds: tuple[int, ...]) -> Row:
    config = StudyConfig(
        trace=trace,
        models=models,
        zipf=zipf,
        load=load,
        policies=POLICIES,
        seeds=seeds,
        gpus_for_slo=True,
        out=out / f"n{models}-z{zipf:g}-l{load:g}",
    )
    started = time.perf_counter()
    runs = run_study(config)
    write_serving_report(config.out, config, config.trace_name, runs)
    return summarise_combination(config, runs, time.perf_counter() - started)


def summarise_combination(config: StudyConfig, runs: list[PolicyRun], wall_s: float) -> Row:
    by = {(r.policy, r.seed): r for r in runs}
    seeds = config.seeds
    savings = [100.0 * (1 - by[("tessera", s)].gpu_hours / by[("static", s)].gpu_hours) for s in seeds]
    below_autoscale = all(by[("tessera", s)].gpu_hours < by[("static-autoscale", s)].gpu_hours for s in seeds)
    tessera_ok = all(by[("tessera", s)].meets_slo(SLO_PCT) and by[("tessera", s)].dropped == 0 for s in seeds)
    row: Row = {"models": config.models, "zipf": config.zipf, "load": config.load, "seeds": list(seeds)}
    for policy in POLICIES:
        mine = [by[(policy, s)] for s in seeds]
        row[policy] = {
            "gpu_hours": round(sum(r.gpu_hours for r in mine) / len(mine), 2),
            "worst_model_slo_attainment_pct": round(min(r.worst_model_slo_attainment_pct for r in mine), 2),
            "dropped": sum(r.dropped for r in mine),
            "cold_starts": sum(r.cold_starts for r in mine),
            "meets_slo_every_seed": all(r.meets_slo(SLO_PCT) and r.dropped == 0 for r in mine),
        }
    row["tessera_saving_vs_static_pct"] = {"mean": round(sum(savings) / len(savings), 1), "min": round(min(savings), 1)}
    row["tessera_below_static_autoscale"] = below_autoscale
    row["passes"] = tessera_ok and min(savings) >= MIN_SAVING_PCT and below_autoscale
    row["wall_s"] = round(wall_s, 1)
    return row


def table(rows: list[Row]) -> str:
    head = (
        "| N | zipf | load | static GPU-h | static-autoscale GPU-h (worst model SLO %) | tessera GPU-h "
        "(worst model SLO %) | tessera saving vs static, mean (min) | passes |\n"
        "|---:|---:|---:|---:|---:|---:|---:|:---:|\n"
    )
    lines = []
    for r in rows:
        sa, te = r["static-autoscale"], r["tessera"]
        saving = r["tessera_saving_vs_static_pct"]
        lines.append(
            f"| {r['models']} | {r['zipf']:g} | {r['load']:g} | {r['static']['gpu_hours']:.1f} | "
            f"{sa['gpu_hours']:.1f} ({sa['worst_model_slo_attainment_pct']:.2f}) | "
            f"{te['gpu_hours']:.1f} ({te['worst_model_slo_attainment_pct']:.2f}) | "
            f"{saving['mean']:.1f}% ({saving['min']:.1f}%) | {'yes' if r['passes'] else 'no'} |"
        )
    return head + "\n".join(lines) + "\n"


def figure(rows: list[Row], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(10, 4.5))
    width = 0.27
    labels = [f"N={r['models']}\nzipf {r['zipf']:g}\nload {r['load']:g}x" for r in rows]
    for i, policy in enumerate(POLICIES):
        xs = [k + (i - 1) * width for k in range(len(rows))]
        ax.bar(xs, [r[policy]["gpu_hours"] for r in rows], width, label=policy)
    ax.set_xticks(range(len(rows)), labels, fontsize=8)
    ax.set_ylabel("GPU-hours (smallest cluster meeting the SLOs)")
    ax.set_title("Serving twin on the Azure conversation trace: GPU-hours per policy")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--models", default="8,32")
    parser.add_argument("--zipf", default="0.9,1.2")
    parser.add_argument("--load", default="1,5")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(argv)
    if not args.trace.is_file():
        print(f"error: {args.trace}: no such file", file=sys.stderr)
        return 2
    seeds = tuple(parse_seeds(args.seeds))
    combos = [
        (n, z, ld)
        for n in (int(x) for x in _floats(args.models))
        for z in _floats(args.zipf)
        for ld in _floats(args.load)
    ]
    args.out.mkdir(parents=True, exist_ok=True)
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        futures = [pool.submit(run_combination, args.trace, args.out, n, z, ld, seeds) for n, z, ld in combos]
        rows = []
        for future in futures:
            row = future.result()
            rows.append(row)
            print(json.dumps(row), flush=True)
    (args.out / "matrix.md").write_text(table(rows))
    figure(rows, args.out / "matrix.png")
    print(table(rows))
    print(json.dumps({"combinations": len(rows), "passing": sum(r["passes"] for r in rows)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
