"""ShapeReserve: placements that take away one of the last hosts of a multi-GPU shape pay for it."""

import numpy as np
import pytest

from tessera.core.cluster import ClusterState, NodeSpec
from tessera.core.fragmentation import typical_pods
from tessera.core.placement import Placer
from tessera.core.placement.base import no_gpu_choice
from tessera.core.placement.reserve import ShapeReserve
from tessera.core.placement.tessera import TesseraParams, TesseraPolicy
from tessera.core.workload import Placement, Request

BIG = Request(num_gpus=8, gpu_milli=1000, cpu_milli=120_000, mem_mib=65_536)  # only a 128-core node takes it
SMALL = Request(num_gpus=1, gpu_milli=1000, cpu_milli=12_000, mem_mib=16_384)


def cluster(*cores: int) -> ClusterState:
    return ClusterState([NodeSpec(f"n{i}", c * 1000, 786_432, 8, "G3") for i, c in enumerate(cores)])


def test_the_charge_falls_on_hosts_that_would_stop_hosting_and_grows_as_hosts_get_few() -> None:
    reserve = ShapeReserve(weight=1.0)
    for request in [SMALL] * 3 + [BIG]:
        reserve.observe(request)
    state = cluster(128, 128, 96)
    nodes = np.arange(3)
    need = np.full(3, 1000)
    # Two hosts of BIG; a 12-core pod on either leaves 116 cores: it stops hosting. The 96-core node never hosted.
    charge = reserve.charge(state, SMALL, nodes, need, no_gpu_choice(3))
    per_host = 0.25 * 8 * 1000 / 2  # a quarter of the requests seen were BIG, 8 GPUs, 2 hosts
    assert charge.tolist() == pytest.approx([per_host, per_host, 0.0])
    # Once one host is spent, the other is the last: its charge doubles.
    state.bind(Placement(0, (0,), SMALL, 1000))
    assert reserve.charge(state, SMALL, nodes, need, no_gpu_choice(3))[1] == pytest.approx(2 * per_host)


def test_a_pod_that_leaves_enough_behind_pays_nothing() -> None:
    reserve = ShapeReserve(weight=1.0)
    reserve.observe(BIG)
    state = cluster(128)
    tiny = Request(cpu_milli=4_000)  # CPU-only: 124 cores and all 8 GPUs stay
    assert reserve.charge(state, tiny, np.array([0]), np.array([0]), no_gpu_choice(1)).tolist() == [0.0]


def test_tessera_keeps_the_last_host_of_a_seen_multi_gpu_shape() -> None:
    chosen = {}
    for weight, seen_big in ((0.0, True), (100.0, False), (100.0, True)):
        state = cluster(128, 96)  # the 128-core node comes first: FGD-style terms prefer it or tie
        policy = TesseraPolicy(
            typical_pods([SMALL] * 30 + [BIG]), state.model_names, params=TesseraParams(reserve_weight=weight)
        )
        if seen_big:
            policy.observe(BIG)
        decision = Placer(state, policy).decide(SMALL, np.random.default_rng(0))
        assert decision is not None
        chosen[(weight, seen_big)] = decision.node
    # Only a reserve that has seen the 8-GPU, 120-core shape sends the small pod to the 96-core node.
    assert chosen == {(0.0, True): 0, (100.0, False): 0, (100.0, True): 1}
