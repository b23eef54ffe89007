"""Placement speed of tessera, fgd and bestfit, as ``tessera bench placement --policy tessera,fgd,bestfit
--baseline fgd`` measures it: one JSON line per policy.

Runs on the openb default trace (``../shared/traces/openb``) when it is there, else on the embedded synthetic
default. The policies run in lockstep in this one process (``benchmark.compare_placement``), so their ratio is
meaningful even where the absolute numbers depend on the machine; the last line is tessera's pods/s over fgd's.
Usage: ``make bench`` or ``python bench/bench_placement.py [--seed N]``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tessera.core.errors import TesseraError
from tessera.sim.placement_study.benchmark import compare_placement
from tessera.sim.placement_study.inputs import ExperimentInputs, default_inputs, load_inputs

OPENB = Path(__file__).resolve().parents[1].parent / "shared" / "traces" / "openb"
NODES = OPENB / "openb_node_list_gpu_node.csv"
PODS = OPENB / "openb_pod_list_default.csv"
POLICIES = ("tessera", "fgd", "bestfit")


def bench_inputs() -> ExperimentInputs:
    if NODES.is_file() and PODS.is_file():
        return load_inputs(NODES, PODS)
    print(f"note: {OPENB} not found; using the embedded synthetic default", file=sys.stderr)
    return default_inputs()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--inflate", type=float, default=1.3)
    args = parser.parse_args()
    try:
        inputs = bench_inputs()
        speed = {}
        for result in compare_placement(inputs, POLICIES, args.seed, args.inflate, baseline="fgd"):
            speed[result["policy"]] = result["pods_per_s"]
            print(json.dumps({"trace": inputs.trace, **result}))
        print(json.dumps({"tessera_over_fgd_pods_per_s": round(speed["tessera"] / max(speed["fgd"], 1e-9), 3)}))
    except TesseraError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
