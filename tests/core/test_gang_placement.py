"""Gang placement prefers one node and otherwise spreads over as few nodes as the free capacity allows."""

import numpy as np

from tessera.core.cluster import ClusterState, NodeSpec
from tessera.core.invariants import check_cluster
from tessera.core.placement import Placer, make_policy
from tessera.core.placement.gang import one_node_candidates
from tessera.core.scheduler import PendingWorkload, Scheduler
from tessera.core.workload import Placement, Request

WORKER = Request(num_gpus=1, gpu_milli=1000, cpu_milli=1000, mem_mib=1024)


def engine_with_busy_first_node() -> Scheduler:
    state = ClusterState([NodeSpec("a", 64_000, 262_144, 8, "T4"), NodeSpec("b", 64_000, 262_144, 8, "T4")])
    state.bind(Placement(0, (0, 1, 2, 3, 4, 5), Request(num_gpus=6, gpu_milli=1000), 1000))  # 2 GPUs left on "a"
    return Scheduler(Placer(state, make_policy("bestfit")))


def test_a_gang_goes_whole_onto_one_node_even_where_best_fit_would_start_it_elsewhere() -> None:
    engine = engine_with_busy_first_node()
    plan = engine.plan([PendingWorkload("gang", WORKER, 0.0, gang=4)], rng=np.random.default_rng(0))
    (bind,) = plan.binds
    assert {p.node for p in bind.placements} == {1}  # best-fit alone would put 2 workers on "a" and 2 on "b"
    assert len({(p.node, p.gpu_indices) for p in bind.placements}) == 4


def test_a_gang_no_node_can_hold_spreads_over_as_few_nodes_as_possible() -> None:
    engine = engine_with_busy_first_node()
    plan = engine.plan([PendingWorkload("wide", WORKER, 0.0, gang=10)], rng=np.random.default_rng(0))
    (bind,) = plan.binds
    nodes = [p.node for p in bind.placements]
    assert sorted(set(nodes)) == [0, 1] and nodes.count(1) == 8 and nodes.count(0) == 2
    for placement in bind.placements:
        engine.state.bind(placement)
    check_cluster(engine.state)


def test_one_node_candidates_count_fractional_slots_per_gpu() -> None:
    state = ClusterState([NodeSpec("a", 64_000, 262_144, 2, "T4")])
    quarter = Request(num_gpus=1, gpu_milli=250, cpu_milli=100)
    assert one_node_candidates(state, quarter, 8).tolist() == [0]  # 4 quarters on each of 2 GPUs
    assert one_node_candidates(state, quarter, 9).tolist() == []
    pair = Request(num_gpus=2, gpu_milli=1000, cpu_milli=100)
    assert one_node_candidates(state, pair, 1).tolist() == [0] and one_node_candidates(state, pair, 2).tolist() == []
