"""The GPU check's steps, one per call: python check.py STEP (gpu_check.sh runs each under `timeout`).

Steps, in gpu_check.sh's order: imports torch discover mps nodes shares watchdog metrics cancel_shares model, then
cleanup strays summary. See README.md here.
"""

from __future__ import annotations

import importlib
import sys

# Each step's module, imported only when the step runs: the summary and the stray hunt work whatever else is broken
STEPS: dict[str, str] = {
    "imports": "steps_gpu",
    "torch": "steps_gpu",
    "discover": "steps_gpu",
    "mps": "steps_gpu",
    "nodes": "steps_gpu",
    "shares": "steps_shares",
    "watchdog": "steps_shares",
    "metrics": "steps_shares",
    "cancel_shares": "steps_shares",
    "model": "steps_model",
    "cleanup": "steps_model",
    "strays": "steps_model",
    "summary": "steps_model",
}


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[1] not in STEPS:
        print(f"usage: python {argv[0]} STEP (one of: {' '.join(STEPS)})", file=sys.stderr)
        return 2
    getattr(importlib.import_module(STEPS[argv[1]]), f"step_{argv[1]}")()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
