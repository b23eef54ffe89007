"""The speed work on ``tessera`` changes no decision: cached scoring equals scoring every node afresh."""

import numpy as np
import pytest

from tessera.core.cluster import ClusterState
from tessera.core.fragmentation import typical_pods
from tessera.core.placement.reserve import ShapeReserve
from tessera.core.placement.tessera import TesseraFragmentation, TesseraParams, TesseraPolicy
from tessera.core.workload import Request
from tessera.sim.placement_study import digest
from tessera.sim.placement_study.inputs import default_inputs

# placement_digest of the synthetic default, seed 1, when the caches went in (cached and fresh agreed).
PINNED = {
    "tessera": ("423d5d33b6500015c138061e02393fa12d2e3bd2d7760c2f34784e5da85d5b99", 2090),
    "tessera-online": ("434e4a714359c80c1e23e855e69c89ece1117b1fd7e6ae92dcd4df053a0adcea", 2077),
}


def test_node_fragmentation_is_the_same_whichever_nodes_are_measured_together() -> None:
    inputs = default_inputs()
    state = ClusterState(inputs.nodes)
    frag = TesseraFragmentation(typical_pods(inputs.requests), state.model_names, TesseraParams())
    rng = np.random.default_rng(0)
    k, g = 64, state.gpu_free_milli.shape[1]
    cpu = rng.integers(0, 96_000, k)
    mem = rng.integers(0, 400_000, k)
    free = rng.integers(0, 11, (k, g)) * 100
    models = state.model_idx[:k]
    together = frag.node_frag(cpu, free, models, mem)
    for size in (1, 2, 3, 5, 7, 17):
        for start in range(0, k - size, size):
            part = slice(start, start + size)
            assert frag.node_frag(cpu[part], free[part], models[part], mem[part]).tolist() == together[part].tolist()


@pytest.mark.parametrize("name", ["tessera", "tessera-online"])
def test_cached_scoring_places_every_pod_where_fresh_scoring_does(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    inputs = default_inputs()
    results = {}
    for cached in (True, False):

        def make(policy: str, typical: object, models: object, c: bool = cached) -> TesseraPolicy:
            return TesseraPolicy(typical, models, online=policy == "tessera-online", cached=c)  # type: ignore[arg-type]

        monkeypatch.setattr(digest, "make_policy", make)
        results[cached] = digest.placement_digest(inputs.nodes, inputs.requests, name, seed=1)
    assert results[True] == results[False] == PINNED[name]


def test_charging_only_the_nodes_that_can_win_picks_the_same_best_nodes() -> None:
    rng = np.random.default_rng(3)
    inputs = default_inputs()
    state = ClusterState(inputs.nodes)
    reserve = ShapeReserve(weight=100.0)
    big = [r for r in inputs.requests if r.num_gpus >= 2]
    assert big
    for request in inputs.requests[:400]:
        reserve.observe(request)
    small = Request(num_gpus=1, gpu_milli=1000, cpu_milli=8_000, mem_mib=16_384)
    nodes = np.arange(state.num_nodes)
    need = np.full(nodes.size, 1000)
    gpu = np.full(nodes.size, -1)
    charged = 0
    for _ in range(50):
        score = (rng.integers(0, 4, nodes.size) * 50).astype(np.float64)  # many ties, charges of the same order
        full = score - reserve.charge(state, small, nodes, need, gpu)
        lazy = reserve.adjust_best(state, small, nodes, need, score, gpu)
        assert lazy.max() == full.max()
        assert np.flatnonzero(lazy == lazy.max()).tolist() == np.flatnonzero(full == full.max()).tolist()
        charged += int((full < score).sum())
    assert charged  # the reserve did charge some nodes


def test_a_large_batch_measures_each_distinct_state_once_with_the_same_result() -> None:
    inputs = default_inputs()
    state = ClusterState(inputs.nodes)
    frag = TesseraFragmentation(typical_pods(inputs.requests), state.model_names, TesseraParams())
    rng = np.random.default_rng(5)
    k, g = 600, state.gpu_free_milli.shape[1]
    pick = rng.integers(0, 12, k)  # twelve distinct states, repeated
    cpu = rng.integers(0, 96_000, 12)[pick]
    mem = rng.integers(0, 400_000, 12)[pick]
    free = (rng.integers(0, 11, (12, g)) * 100)[pick]
    models = state.model_idx[:12][pick]
    together = frag.node_frag(cpu, free, models, mem)
    alone = [frag.node_frag(cpu[i : i + 1], free[i : i + 1], models[i : i + 1], mem[i : i + 1])[0] for i in range(k)]
    assert together.tolist() == alone


def test_fgd_places_as_before_the_speed_work() -> None:
    inputs = default_inputs()
    assert digest.placement_digest(inputs.nodes, inputs.requests, "fgd", seed=1) == (
        "7bd724ee2854716187d2032967507c71909f03c3ef6c29037b3bdbe80cbf4608",
        2061,
    )
