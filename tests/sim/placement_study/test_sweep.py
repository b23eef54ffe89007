"""Sweeps over (policy, seed) runs (tessera.sim.placement_study.sweep): option parsing, ordering, pool == in-process."""

from __future__ import annotations

import numpy as np
import pytest

from tessera.core.errors import InvalidRequestError
from tessera.core.workload import Request
from tessera.sim.placement_study.inflation import run_inflation
from tessera.sim.placement_study.sweep import (
    RunResult,
    _ordered_tasks,
    parse_policies,
    parse_seeds,
    result_of,
    run_sweep,
)
from tessera.sim.workloads.synthetic import synthetic_nodes, synthetic_pods

NODES = synthetic_nodes(num_nodes=16, seed=5)
REQUESTS: list[Request] = [pod.request for pod in synthetic_pods(num_pods=120, seed=5, nodes=NODES)]


@pytest.mark.parametrize(
    ("text", "seeds"),
    [("42-51", list(range(42, 52))), ("42,43,50", [42, 43, 50]), ("7", [7]), (" 1-2, 9 ", [1, 2, 9]), ("3-3", [3])],
)
def test_parse_seeds(text: str, seeds: list[int]) -> None:
    assert parse_seeds(text) == seeds


@pytest.mark.parametrize("text", ["", "x", "5-3", "-1", "1,1", "1-2,2", "1.5", "1-2-3"])
def test_parse_seeds_rejects(text: str) -> None:
    with pytest.raises(InvalidRequestError, match="--seeds"):
        parse_seeds(text)


def test_parse_policies() -> None:
    assert parse_policies("fgd, BestFit") == ["fgd", "bestfit"]
    for bad in ("", "fgd,tetris", "fgd,fgd"):
        with pytest.raises(InvalidRequestError, match="--policies"):
            parse_policies(bad)


def test_tasks_start_with_the_slowest_policy() -> None:
    tasks = _ordered_tasks(["random", "bestfit", "fgd"], [1, 2])
    assert tasks[:2] == [("fgd", 1), ("fgd", 2)]
    assert sorted(tasks) == sorted((p, s) for p in ("random", "bestfit", "fgd") for s in (1, 2))


def _assert_same_runs(left: list[RunResult], right: list[RunResult]) -> None:
    """Everything but the timing-dependent pods/s is equal (NaN buckets included)."""
    assert [(r.policy, r.seed, r.arrivals) for r in left] == [(r.policy, r.seed, r.arrivals) for r in right]
    for a, b in zip(left, right, strict=True):
        np.testing.assert_array_equal(a.curves.alloc_pct, b.curves.alloc_pct)
        np.testing.assert_array_equal(a.curves.frag_pct, b.curves.frag_pct)
        np.testing.assert_array_equal(a.curves.frag_ratio_pct, b.curves.frag_ratio_pct)
        assert a.pods_per_s > 0 and b.pods_per_s > 0


def test_pool_and_in_process_give_identical_results() -> None:
    policies, seeds = ["bestfit", "fgd"], [3, 1]
    done: list[tuple[str, int]] = []
    in_process = run_sweep(NODES, REQUESTS, policies, seeds, 1.3, jobs=1, on_done=lambda p, s: done.append((p, s)))
    pooled = run_sweep(NODES, REQUESTS, policies, seeds, 1.3, jobs=2)

    assert [(r.policy, r.seed) for r in in_process] == [("bestfit", 1), ("bestfit", 3), ("fgd", 1), ("fgd", 3)]
    assert sorted(done) == sorted((p, s) for p in policies for s in seeds)
    _assert_same_runs(in_process, pooled)


def test_result_of_one_run() -> None:
    samples = run_inflation(NODES, REQUESTS, "dotprod", 4)
    result = result_of(samples)
    assert (result.policy, result.seed, result.arrivals) == ("dotprod", 4, samples.arrivals)
    assert result.pods_per_s == pytest.approx(samples.arrivals / samples.decision_s.sum())
    assert result.curves.alloc_pct.shape == (131,)


@pytest.mark.parametrize(("jobs", "inflate"), [(0, 1.3), (1, 0.0), (1, -1.0), (1, 11.0)])
def test_run_sweep_rejects_bad_settings(jobs: int, inflate: float) -> None:
    with pytest.raises(InvalidRequestError):
        run_sweep(NODES, REQUESTS, ["fgd"], [1], inflate, jobs=jobs)
