"""The serving twin against the Splitwise simulator's results on the same request trace.

Usage: python bench/serving_fidelity.py --trace FILE --results RESULTS.csv [--mode compat|calibrated|both]
       [--perf-model PERF_MODEL.csv] [--model-config NAME=config.json ...] [--model-profile [NAME=]PERF.csv ...]

Runs the twin once per row of RESULTS.csv (a cluster size) and mode, set up as that simulator's baseline
(``tessera.sim.serving.fidelity``; docs/serving-fidelity.md), prints a table of our percentiles and their relative
errors against the reference, then one JSON line ``{"rows": int, "max_rel_err_pct": float, ...}``: the largest
|relative error| over the p50/p90/p99 of TTFT, TBT and E2E of the rows whose cluster is not saturated (reference TTFT
p99 < 10 s), for the first mode run (compat under ``both``); ``by_mode`` gives it per mode. Bad input: one line
naming the file, line and field, exit 2.

A results row may name any model the twin knows (the catalog's, and bloom-176b of the Splitwise grid) or one brought
with ``--model-config`` (its architecture: weights and the simulator's KV accounting need it) and
``--model-profile`` (its Splitwise-format rows, when ``--perf-model`` does not hold them), as
``tessera simulate serving`` takes them (``tessera.serving.model_book``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from tessera.core.errors import TesseraError
from tessera.serving.model_book import build_model_book
from tessera.serving.perf_model import shared_calibration_csv
from tessera.sim.serving.config import parse_named_path
from tessera.sim.serving.fidelity import (
    METRICS,
    MODES,
    PERCENTILES,
    RowResult,
    column,
    compare,
    max_rel_err_pct,
    read_results,
)
from tessera.sim.serving.trace import read_llm_trace


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", type=Path, required=True, help="the request trace the results were made from")
    parser.add_argument("--results", type=Path, required=True, help="the Splitwise simulator's results CSV")
    parser.add_argument("--mode", choices=(*MODES, "both"), default="both")
    parser.add_argument(
        "--perf-model",
        type=Path,
        default=shared_calibration_csv(),
        help="the characterization grid (default: ../shared/traces/splitwise/perf_model.csv)",
    )
    parser.add_argument(
        "--model-config", action="append", default=[], help="NAME=config.json: a model by its architecture (repeat)"
    )
    parser.add_argument(
        "--model-profile", action="append", default=[], help="[NAME=]PERF.csv: a model's measured rows (repeat)"
    )
    args = parser.parse_args(argv)
    if args.perf_model is None or not args.perf_model.is_file():
        print(f"error: no performance model file: {args.perf_model} (give --perf-model)", file=sys.stderr)
        return 2
    modes = list(MODES) if args.mode == "both" else [args.mode]
    started = time.perf_counter()
    try:
        book = build_model_book(
            [_named(parse_named_path(text, "--model-config")) for text in args.model_config],
            [parse_named_path(text, "--model-profile", name_required=False) for text in args.model_profile],
        )
        trace = read_llm_trace(args.trace)
        rows = read_results(args.results)
        progress = lambda m: print(m, file=sys.stderr)  # noqa: E731
        results = compare(trace, rows, args.perf_model, modes, progress, book)
    except (TesseraError, OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    Console(width=160).print(render(results))
    by_mode = {mode: max_rel_err_pct([r for r in results if r.mode == mode]) for mode in modes}
    scored, worst = by_mode[modes[0]]
    summary = {
        "rows": scored,
        "max_rel_err_pct": round(worst, 2),
        "mode": modes[0],
        "by_mode": {mode: round(err, 2) for mode, (_, err) in by_mode.items()},
        "wall_s": round(time.perf_counter() - started, 1),
    }
    print(json.dumps(summary))
    return 0


def _named(pair: tuple[str | None, Path]) -> tuple[str, Path]:
    name, path = pair
    assert name is not None  # required for --model-config
    return name, path


def render(results: list[RowResult]) -> Table:
    table = Table(title="twin vs Splitwise simulator: ours (relative error) per percentile")
    for name in ("mode", "servers", "scored", "metric"):
        table.add_column(name)
    for pct in PERCENTILES:
        table.add_column(f"p{pct}", justify="right")
    table.add_column("max |err| %", justify="right")
    for r in results:
        for metric in METRICS:
            cells = []
            for pct in PERCENTILES:
                key = column(metric, pct)
                cells.append(f"{r.ours[key]:.4g} s ({r.rel_err_pct[key]:+.1f}%)")
            worst = max(abs(r.rel_err_pct[column(metric, p)]) for p in PERCENTILES)
            scored = "yes" if r.scored else "no (saturated)"
            table.add_row(r.mode, str(r.reference.servers), scored, metric, *cells, f"{worst:.1f}")
        table.add_section()
    return table


if __name__ == "__main__":
    sys.exit(main())
