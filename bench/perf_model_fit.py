"""Fit errors of the calibrated performance model on every measured grid point of the Splitwise grid.

Usage: python bench/perf_model_fit.py [--csv PATH] [--cross]

For each (model, hardware, TP) of the file: the model calibrated on that configuration predicts each grid point's
prefill (``iteration_s(prompt_size x batch_size, 0, 0)``) and decode step (``iteration_s(0, batch_size, kv)`` at
kv = batch_size x (prompt_size + token_size / 2), the mean context over the run's decode), against the medians of
the repeats. Points dropped as failed runs are printed, marked, and left out of the summary. ``--cross`` adds the
scaling check: each configuration predicted from another one by ``scaled_to`` (another TP of the same model and
hardware, and llama2-70b -> bloom-176b), never from itself.

The last line is one JSON object: the mean and max absolute percentage errors of prefill and decode.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path

from tessera.serving.perf_calibrated import CalibratedPerf, GridPoint, calibration_shape, grid_points, split_failed_runs
from tessera.serving.perf_csv import SplitwiseRow, read_splitwise_rows
from tessera.serving.perf_model import PerfModel, ScalingAssumptions, sweep_collectives

DEFAULT_CSV = Path(__file__).resolve().parents[1].parent / "shared" / "traces" / "splitwise" / "perf_model.csv"
Config = tuple[str, str, int]


def errors_pct(perf: PerfModel, point: GridPoint) -> tuple[float, float]:
    """(prefill, decode) signed relative errors of ``perf`` at ``point``, in percent."""
    prefill = perf.iteration_s(point.batch_tokens, 0, 0) * 1000
    decode = perf.iteration_s(0, point.batch_size, round(point.kv_tokens)) * 1000
    return 100 * (prefill / point.prefill_ms - 1), 100 * (decode / point.decode_ms - 1)


def summary(errors: list[tuple[float, float]]) -> dict[str, float]:
    prefill = [abs(e[0]) for e in errors]
    decode = [abs(e[1]) for e in errors]
    return {
        "prefill_mape_pct": round(statistics.fmean(prefill), 2),
        "prefill_max_ape_pct": round(max(prefill), 2),
        "decode_mape_pct": round(statistics.fmean(decode), 2),
        "decode_max_ape_pct": round(max(decode), 2),
    }


def fit_table(by_config: dict[Config, list[SplitwiseRow]]) -> list[tuple[float, float]]:
    print(
        f"{'config':<32} {'prompt':>6} {'batch':>5} {'tokens':>6} {'prefill ms':>10} {'err %':>7} "
        f"{'decode ms':>9} {'err %':>7}"
    )
    kept_errors: list[tuple[float, float]] = []
    for config, rows in sorted(by_config.items()):
        perf = CalibratedPerf.from_rows(rows)
        kept, failed = split_failed_runs(grid_points(rows))
        for point in sorted([*kept, *failed], key=lambda g: (g.batch_tokens, g.batch_size, g.token_size)):
            prefill_err, decode_err = errors_pct(perf, point)
            mark = "  (failed run: excluded)" if point in failed else ""
            if not mark:
                kept_errors.append((prefill_err, decode_err))
            name = f"{config[0]} {config[1]} tp{config[2]}"
            print(
                f"{name:<32} {point.prompt_size:>6} {point.batch_size:>5} {point.token_size:>6} "
                f"{point.prefill_ms:>10.1f} {prefill_err:>+7.1f} {point.decode_ms:>9.2f} {decode_err:>+7.1f}{mark}"
            )
        config_errors = [errors_pct(perf, p) for p in kept]
        print(
            f"{'':<32} {'':>6} {'':>5} {'':>6} {'MAPE':>10} {summary(config_errors)['prefill_mape_pct']:>7.2f} "
            f"{'':>9} {summary(config_errors)['decode_mape_pct']:>7.2f}"
        )
    return kept_errors


def cross_sources(configs: list[Config]) -> list[tuple[Config, Config]]:
    """(source, target) pairs: other TPs of the same model and hardware, and llama2-70b -> bloom-176b at TP8."""
    pairs = [(s, t) for s in configs for t in configs if s != t and s[:2] == t[:2]]
    pairs += [
        (s, t) for s in configs for t in configs if s[0] == "llama2-70b" and t[0] == "bloom-176b" and s[1:] == t[1:]
    ]
    return [(s, t) for s, t in pairs if calibration_shape(*s) and calibration_shape(*t)]


def cross_table(csv_path: Path, by_config: dict[Config, list[SplitwiseRow]]) -> dict[str, dict[str, float]]:
    print("\nscaling check: target predicted from a source by scaled_to (MAPE %, kept points of the target)")
    print(f"{'source':<32} {'target':<32} {'prefill':>8} {'decode':>8}")
    results: dict[str, dict[str, float]] = {}
    for source, target in cross_sources(sorted(by_config)):
        shape = calibration_shape(*target)
        assert shape is not None
        rows = [r for config in by_config.values() for r in config]
        assume = ScalingAssumptions(collectives=sweep_collectives(csv_path, rows, source[0], source[1]))
        base = CalibratedPerf.from_rows(by_config[source])
        perf = base.scaled_to(shape.spec, shape.gpu, shape.tensor_parallel, assume)
        kept, _ = split_failed_runs(grid_points(by_config[target]))
        stats = summary([errors_pct(perf, p) for p in kept])
        names = [f"{c[0]} {c[1]} tp{c[2]}" for c in (source, target)]
        print(f"{names[0]:<32} {names[1]:<32} {stats['prefill_mape_pct']:>8.1f} {stats['decode_mape_pct']:>8.1f}")
        results[f"{names[0]} -> {names[1]}"] = stats
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--csv", type=Path, default=DEFAULT_CSV, help=f"the grid (default: {DEFAULT_CSV})")
    parser.add_argument("--cross", action="store_true", help="also predict each configuration from another one")
    args = parser.parse_args()
    by_config: dict[Config, list[SplitwiseRow]] = defaultdict(list)
    for row in read_splitwise_rows(args.csv):
        by_config[row.config].append(row)
    errors = fit_table(by_config)
    result: dict[str, object] = {"configs": len(by_config), "points": len(errors), **summary(errors)}
    if args.cross:
        cross = cross_table(args.csv, by_config)
        result["cross_decode_mape_pct"] = round(statistics.fmean(s["decode_mape_pct"] for s in cross.values()), 2)
        result["cross_prefill_mape_pct"] = round(statistics.fmean(s["prefill_mape_pct"] for s in cross.values()), 2)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
