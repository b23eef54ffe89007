"""docs/scheduling-over-time.md stays true: the training table's tessera and tiresias rows (seed 0), the two
policies whose figures a scheduling change moves, are what the replay gives now. Issue 25: the table had been written
before commit 3b6e373 changed their decisions and no longer reproduced. (A change that moves them again must
re-measure the doc's tables, as ``bench/timeline_tables.py`` does, and update them.)"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from tessera.sim.replay.timeline import run_timeline
from tessera.sim.workloads.inputs import timeline_inputs

ROOT = Path(__file__).resolve().parents[3]
DOC = ROOT / "docs" / "scheduling-over-time.md"
TRACES = ROOT.parent / "shared" / "traces"


def documented_rows(section: str) -> dict[str, tuple[float, float, int]]:
    """policy -> (avg JCT h, p99 JCT h, preemptions) of the first table under ``## section``."""
    text = DOC.read_text().split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in text.splitlines():
        cells = [c.strip().strip("*") for c in line.strip("|").split("|")]
        if len(cells) == 7 and re.fullmatch(r"[\d.]+", cells[1]):
            rows[cells[0]] = (float(cells[1]), float(cells[2]), int(cells[5]))
    return rows


@pytest.mark.slow
@pytest.mark.skipif(not (TRACES / "gavel").is_dir(), reason="../shared/traces is not here")
@pytest.mark.parametrize("policy", ["tiresias", "tessera"])
def test_the_training_table_reproduces(policy: str) -> None:
    documented = documented_rows("training")[policy]
    inputs = timeline_inputs("training", None, None, None, 0, TRACES, None, None)
    result = run_timeline(
        inputs.nodes, inputs.jobs, policy, 0, inputs.throughput, inputs.queues, colocation=inputs.colocation
    )
    avg_h = round(float(np.mean(result.jct_s)) / 3600, 2)
    p99_h = round(float(np.percentile(result.jct_s, 99)) / 3600, 2)
    assert (avg_h, p99_h, result.preemptions) == documented
