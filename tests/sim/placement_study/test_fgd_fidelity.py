"""Fidelity against the FGD study's published results on the default openb trace (fgd and bestfit, +-0.5 pp).

Slow (20 full runs, about 30-60 s on two cores); skipped when ../shared/traces is absent. CI runs it.
"""

import statistics
from pathlib import Path

import pytest

from tessera.sim.placement_study.inputs import load_inputs
from tessera.sim.placement_study.published import fidelity_tolerance_pp, load_published
from tessera.sim.placement_study.sweep import run_sweep

TRACES = Path(__file__).resolve().parents[3].parent / "shared" / "traces"
TRACE = "openb_pod_list_default"


@pytest.mark.slow
@pytest.mark.skipif(not (TRACES / "openb" / f"{TRACE}.csv").exists(), reason="../shared/traces is not here")
def test_default_trace_reproduces_published_fgd_and_bestfit() -> None:
    published = load_published(TRACES / "fgd-results" / "analysis_allo_discrete.csv")
    inputs = load_inputs(TRACES / "openb" / "openb_node_list_gpu_node.csv", TRACES / "openb" / f"{TRACE}.csv")
    results = run_sweep(inputs.nodes, inputs.requests, ["fgd", "bestfit"], list(range(42, 52)), 1.3, jobs=2)
    for policy in ("fgd", "bestfit"):
        for bucket in (100, 130):
            ours = statistics.mean(r.curves.unallocated_pct(bucket) for r in results if r.policy == policy)
            theirs = published[(TRACE, policy)].mean(bucket)
            assert abs(ours - theirs) <= fidelity_tolerance_pp(TRACE, policy), (policy, bucket, ours, theirs)
