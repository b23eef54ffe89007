"""What each placement policy prefers, on clusters small enough to reason about by hand."""

import numpy as np
import pytest

from tessera.core.cluster import ClusterState, NodeSpec
from tessera.core.errors import InvalidRequestError
from tessera.core.fragmentation import typical_pods
from tessera.core.placement import FGD_STUDY_POLICIES, Placer, TieBreak, make_policy
from tessera.core.workload import Placement, Request

SHARE = Request(num_gpus=1, gpu_milli=400, cpu_milli=2_000)
WHOLE = Request(num_gpus=1, gpu_milli=1000, cpu_milli=4_000)


def cluster() -> ClusterState:
    return ClusterState(
        [
            NodeSpec("n0", 64_000, 262_144, 8, "G2"),
            NodeSpec("n1", 64_000, 262_144, 2, "T4"),
            NodeSpec("n2", 64_000, 262_144, 2, "T4"),
        ]
    )


def placer(name: str, state: ClusterState, workload: list[Request] | None = None) -> Placer:
    typical = typical_pods(workload or [SHARE, WHOLE])
    return Placer(state, make_policy(name, typical, state.model_names))


def test_packing_fills_the_fullest_shared_gpu_first() -> None:
    state = cluster()
    state.bind(Placement(2, (1,), Request(num_gpus=1, gpu_milli=500), 500))
    state.bind(Placement(1, (0,), Request(num_gpus=1, gpu_milli=300), 300))
    decision = placer("packing", state).decide(SHARE, np.random.default_rng(0))
    assert decision is not None and (decision.node, decision.gpu_indices) == (2, (1,))


def test_bestfit_prefers_the_node_with_least_left_over() -> None:
    state = cluster()
    state.bind(Placement(1, (0,), WHOLE, 1000))
    decision = placer("bestfit", state).decide(WHOLE, np.random.default_rng(0))
    assert decision is not None and decision.node == 1 and decision.gpu_indices == (1,)


def test_fgd_completes_a_gpu_rather_than_opening_a_new_one() -> None:
    state = cluster()
    state.bind(Placement(0, (3,), Request(num_gpus=1, gpu_milli=600, cpu_milli=2_000), 600))
    decision = placer("fgd", state, [SHARE] * 9 + [WHOLE]).decide(SHARE, np.random.default_rng(0))
    # Taking the last 0.4 of GPU 3 leaves no sliver behind: no fragmentation added.
    assert decision is not None and (decision.node, decision.gpu_indices) == (0, (3,))


def test_clustering_keeps_kinds_together() -> None:
    state = cluster()
    state.bind(Placement(1, (0,), WHOLE, 1000))
    state.bind(Placement(2, (0,), Request(num_gpus=1, gpu_milli=200), 200))
    decision = placer("clustering", state).decide(WHOLE, np.random.default_rng(0))
    assert decision is not None and decision.node == 1


def test_whole_gpu_requests_take_the_lowest_free_indices() -> None:
    state = cluster()
    state.bind(Placement(0, (0,), Request(num_gpus=1, gpu_milli=100), 100))
    request = Request(num_gpus=4, gpu_milli=1000)
    decision = placer("dotprod", state).decide(request, np.random.default_rng(0))
    assert decision is not None and decision.node == 0 and decision.gpu_indices == (1, 2, 3, 4)


def test_no_feasible_node_means_no_decision() -> None:
    state = cluster()
    for name in FGD_STUDY_POLICIES:
        assert (
            placer(name, state).decide(Request(num_gpus=8, gpu_milli=1000, cpu_milli=100_000), np.random.default_rng(0))
            is None
        )


def test_random_tie_break_spreads_over_equal_nodes_and_first_does_not() -> None:
    state = ClusterState([NodeSpec(f"n{i}", 8_000, 8_192, 1, "T4") for i in range(4)])
    policy = make_policy("dotprod")
    rng = np.random.default_rng(1)
    random_nodes = {Placer(state, policy, TieBreak.RANDOM).decide(WHOLE, rng).node for _ in range(40)}  # type: ignore[union-attr]
    first_nodes = {Placer(state, policy, TieBreak.FIRST).decide(WHOLE, rng).node for _ in range(40)}  # type: ignore[union-attr]
    assert random_nodes == {0, 1, 2, 3}
    assert first_nodes == {0}


def test_the_score_cache_sees_changes_made_after_the_first_decision() -> None:
    state = cluster()
    engine = placer("packing", state)
    first = engine.decide(SHARE, np.random.default_rng(0))
    assert first is not None
    state.bind(first)
    second = engine.decide(SHARE, np.random.default_rng(0))
    # Packing must now see the GPU the first request shares.
    assert second is not None and (second.node, second.gpu_indices) == (first.node, first.gpu_indices)


def test_unknown_policy_names_the_field() -> None:
    with pytest.raises(InvalidRequestError) as info:
        make_policy("magic")
    assert info.value.field == "policy"


def test_a_memory_request_is_a_share_on_big_gpus_and_a_whole_gpu_on_small_ones() -> None:
    state = ClusterState([NodeSpec("small", 32_000, 65_536, 2, "T4"), NodeSpec("big", 32_000, 65_536, 2, "A100-80GB")])
    request = Request(num_gpus=1, gpu_mem_mib=16 * 1024, cpu_milli=1000)
    for name in FGD_STUDY_POLICIES:
        engine = Placer(state, make_policy(name, typical_pods([request]), state.model_names))
        decision = engine.decide(request, np.random.default_rng(0))
        assert decision is not None
        expected = 1000 if decision.node == 0 else 200  # 16 GiB of a 16 GiB T4, of an 80 GiB A100
        assert decision.gpu_milli_each == expected, name
