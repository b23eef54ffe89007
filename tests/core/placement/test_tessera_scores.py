"""tessera's one-measurement scoring and its kept reserve bits give what scoring every node afresh gives.

``TesseraPolicy(cached=False)`` scores the FGD way (``F`` before and after measured separately, no cache) and
charges the reserve on every node; these tests put both on the same random cluster states and requests.
"""

import numpy as np
from placement_cases import random_requests, random_state

from tessera.core.cluster import ClusterState
from tessera.core.fragmentation import typical_pods
from tessera.core.placement.tessera import TesseraPolicy
from tessera.sim.placement_study.inputs import default_inputs


def test_scores_and_gpus_equal_fresh_fgd_style_scoring_on_random_states() -> None:
    inputs = default_inputs()
    rng = np.random.default_rng(11)
    state = ClusterState(inputs.nodes)
    typical = typical_pods(inputs.requests)
    fast = TesseraPolicy(typical, state.model_names)
    fresh = TesseraPolicy(typical, state.model_names, cached=False)
    compared = sharing = 0
    for _ in range(15):
        random_state(state, rng)
        for request in random_requests(rng, state.model_names, 12, cpu_only_floor=1000):
            need = state.milli_by_model(request)[state.model_idx]
            every = np.arange(state.num_nodes)
            feasible = every[state.feasible(request, every, need)]
            for nodes in (feasible, feasible[: rng.integers(1, 5)], feasible[rng.random(feasible.size) < 0.3]):
                if nodes.size == 0:
                    continue
                got = fast.score_nodes(state, request, nodes, need[nodes])
                want = fresh.score_nodes(state, request, nodes, need[nodes])
                assert got.score.tolist() == want.score.tolist()
                assert got.gpu.tolist() == want.gpu.tolist()
                compared += nodes.size
                sharing += int((want.gpu >= 0).sum())
    assert compared > 10_000 and sharing > 1_000  # both kinds of placement were compared, many times


def test_kept_reserve_bits_pick_the_best_nodes_that_charging_every_node_picks() -> None:
    inputs = default_inputs()
    rng = np.random.default_rng(12)
    state = ClusterState(inputs.nodes)
    typical = typical_pods(inputs.requests)
    fast = TesseraPolicy(typical, state.model_names)
    fresh = TesseraPolicy(typical, state.model_names, cached=False)
    big = [r for r in inputs.requests if r.num_gpus >= 2]
    assert big
    for request in inputs.requests[:600] + big:
        fast.observe(request)
        fresh.observe(request)
    charged = 0
    for _ in range(20):
        random_state(state, rng)
        state.gpu_free_milli[:] = np.where(rng.random(state.gpu_free_milli.shape) < 0.7, 1000, state.gpu_free_milli)
        state.gpu_free_milli[~state.gpu_exists] = 0
        for request in random_requests(rng, state.model_names, 12, cpu_only_floor=1000):
            need = state.milli_by_model(request)[state.model_idx]
            every = np.arange(state.num_nodes)
            nodes = every[state.feasible(request, every, need)]
            if nodes.size == 0:
                continue
            scored = fast.score_nodes(state, request, nodes, need[nodes])
            got = fast.adjust(state, request, nodes, need[nodes], scored)
            want = fresh.adjust(state, request, nodes, need[nodes], scored)
            assert got.max() == want.max()
            assert np.flatnonzero(got == got.max()).tolist() == np.flatnonzero(want == want.max()).tolist()
            charged += int((want < scored.score).any())
    assert charged  # the reserve did charge
