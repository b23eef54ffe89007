"""The arrival-inflation experiment: inflation arithmetic, bucketing, determinism and invariants per placement."""

from pathlib import Path

import numpy as np

from tessera.core.cluster import NodeSpec
from tessera.core.workload import Request
from tessera.sim.kernel import EventLoop
from tessera.sim.placement_study.inflation import RunSamples, bucketize, inflate_requests, run_inflation
from tessera.sim.placement_study.inputs import load_inputs
from tessera.sim.traces.openb import write_nodes_csv, write_pods_csv
from tessera.sim.workloads.synthetic import synthetic_nodes, synthetic_pods


def small_inputs() -> tuple[list[NodeSpec], list[Request]]:
    nodes = synthetic_nodes(40, seed=3)
    pods = synthetic_pods(300, seed=3, nodes=nodes)
    return nodes, [p.request for p in sorted(pods, key=lambda p: p.name)]


def test_inflation_stops_before_passing_the_target_and_keeps_every_original() -> None:
    requests = [Request(num_gpus=1, gpu_milli=500), Request(num_gpus=2, gpu_milli=1000), Request(cpu_milli=1)]
    arrivals = inflate_requests(requests, capacity_milli=10_000, factor=1.3, rng=np.random.default_rng(0))
    total = sum(r.total_gpu_milli for r in arrivals)
    assert total <= 13_000 and total + 2000 > 13_000 - 500
    for original in requests:
        assert original in arrivals


def test_every_placement_keeps_the_invariants_and_runs_are_deterministic() -> None:
    nodes, requests = small_inputs()
    for policy in ("random", "dotprod", "clustering", "packing", "bestfit", "fgd"):
        first = run_inflation(nodes, requests, policy, seed=7, check_invariants=True)
        again = run_inflation(nodes, requests, policy, seed=7)
        assert np.array_equal(first.allocated_milli, again.allocated_milli), policy
        assert first.allocated_milli[-1] <= first.capacity_milli
        assert np.all(np.diff(first.arrived_milli) >= 0)


def test_buckets_average_samples_and_borrow_neighbours_for_empty_ones() -> None:
    capacity = 100_000
    arrived = np.array([1_000.0, 1_200.0, 4_000.0])  # buckets 1, 1, 4 (2 and 3 empty)
    samples = RunSamples(
        "x", 0, capacity, arrived, np.array([1_000.0, 1_200.0, 3_000.0]), np.zeros(3), np.full(3, 1.0), np.zeros(3), 3
    )
    curves = bucketize(samples)
    assert curves.alloc_pct[1] == 1.1
    assert curves.alloc_pct[3] == 3.0  # borrowed from bucket 4
    assert curves.alloc_pct[2] == 1.1  # borrowed from bucket 1
    assert np.isnan(curves.alloc_pct[10])


def test_event_loop_runs_in_time_then_priority_then_insertion_order() -> None:
    loop: EventLoop[str] = EventLoop()
    seen: list[str] = []
    loop.schedule(2.0, "late")
    loop.schedule(1.0, "b", priority=1)
    loop.schedule(1.0, "a", priority=0)
    loop.schedule(1.0, "c", priority=1)
    loop.run(lambda _now, event: seen.append(event))
    assert seen == ["a", "b", "c", "late"]


def test_unseen_trace_variants_run_end_to_end_with_constraints_honoured(tmp_path: Path) -> None:
    """A constrained, multi-GPU trace written in both column forms loads and runs with invariants checked."""
    nodes = synthetic_nodes(60, seed=11)
    pods = synthetic_pods(500, seed=11, constrained_share=0.5, nodes=nodes)
    assert any(p.request.gpu_types for p in pods) and max(p.request.num_gpus for p in pods) == 8
    write_nodes_csv(nodes, tmp_path / "nodes.csv")
    for columns in (11, 5):
        write_pods_csv(pods, tmp_path / f"pods{columns}.csv", columns=columns)
        inputs = load_inputs(tmp_path / "nodes.csv", tmp_path / f"pods{columns}.csv")
        for policy in ("fgd", "bestfit", "random"):
            # check_invariants verifies after every placement that each constrained pod sits on an allowed model.
            samples = run_inflation(inputs.nodes, inputs.requests, policy, seed=5, check_invariants=True)
            assert samples.placed > 0
