"""tessera's one-measurement scoring and its kept reserve bits give what scoring every node afresh gives.

``TesseraPolicy(cached=False)`` scores the FGD way (``F`` before and after measured separately, no cache) and
charges the reserve on every node; these tests put both on the same random cluster states and requests.
"""

import numpy as np

from tessera.core.cluster import ClusterState
from tessera.core.fragmentation import typical_pods
from tessera.core.placement.tessera import TesseraPolicy
from tessera.core.workload import MILLI_PER_GPU, Request
from tessera.sim.placement_study.inputs import default_inputs


def _random_state(state: ClusterState, rng: np.random.Generator) -> None:
    """Random free GPU shares (multiples of 50, some whole, some empty), CPU and memory; every node bumped."""
    free = rng.choice([0, 50, 100, 250, 300, 500, 700, 1000, 1000, 1000], size=state.gpu_free_milli.shape)
    state.gpu_free_milli[:] = np.where(state.gpu_exists, free, 0)
    state.cpu_free_milli[:] = (state.cpu_cap_milli * rng.random(state.num_nodes)).astype(np.int64)
    state.mem_free_mib[:] = (state.mem_cap_mib * rng.random(state.num_nodes)).astype(np.int64)
    state.version += 1


def _requests(rng: np.random.Generator, models: tuple[str, ...]) -> list[Request]:
    out = []
    for _ in range(12):
        kind = rng.integers(5)
        cpu, mem = int(rng.integers(0, 16)) * 1000, int(rng.integers(0, 64)) * 1024
        if kind == 0:
            out.append(Request(cpu_milli=cpu or 1000, mem_mib=mem))
        elif kind == 1:
            out.append(Request(num_gpus=1, gpu_milli=int(rng.choice([100, 250, 300, 500, 810])), cpu_milli=cpu))
        elif kind == 2:
            out.append(Request(num_gpus=int(rng.choice([1, 2, 4, 8])), gpu_milli=MILLI_PER_GPU, cpu_milli=cpu))
        elif kind == 3:  # a share on a large model, a whole GPU on a small one
            out.append(Request(num_gpus=1, gpu_mem_mib=int(rng.choice([6_000, 12_000, 20_000])), cpu_milli=cpu))
        else:
            out.append(Request(num_gpus=1, gpu_milli=500, cpu_milli=cpu, gpu_types=frozenset(models[:2])))
    return out


def test_scores_and_gpus_equal_fresh_fgd_style_scoring_on_random_states() -> None:
    inputs = default_inputs()
    rng = np.random.default_rng(11)
    state = ClusterState(inputs.nodes)
    typical = typical_pods(inputs.requests)
    fast = TesseraPolicy(typical, state.model_names)
    fresh = TesseraPolicy(typical, state.model_names, cached=False)
    compared = sharing = 0
    for _ in range(15):
        _random_state(state, rng)
        for request in _requests(rng, state.model_names):
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
        _random_state(state, rng)
        state.gpu_free_milli[:] = np.where(rng.random(state.gpu_free_milli.shape) < 0.7, 1000, state.gpu_free_milli)
        state.gpu_free_milli[~state.gpu_exists] = 0
        for request in _requests(rng, state.model_names):
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
