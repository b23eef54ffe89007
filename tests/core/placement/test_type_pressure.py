"""TypePressure: flexible pods pay for taking GPU types that type-constrained pods need."""

import numpy as np

from tessera.core.cluster import ClusterState, NodeSpec
from tessera.core.fragmentation import typical_pods
from tessera.core.placement import Placer
from tessera.core.placement.tessera import TesseraParams, TesseraPolicy
from tessera.core.placement.type_pressure import TypePressure
from tessera.core.workload import Placement, Request

FLEX = Request(num_gpus=1, gpu_milli=1000, cpu_milli=4_000, mem_mib=8_192)
T4_ONLY = Request(num_gpus=1, gpu_milli=1000, cpu_milli=4_000, mem_mib=8_192, gpu_types=frozenset({"T4"}))


def cluster() -> ClusterState:
    return ClusterState([NodeSpec("big", 64_000, 262_144, 4, "G2"), NodeSpec("small", 64_000, 262_144, 4, "T4")])


def test_the_charge_grows_as_a_constrained_type_runs_short_and_spares_pods_bound_to_one_type() -> None:
    pressure = TypePressure(weight=1.0)
    for request in (FLEX, T4_ONLY):
        pressure.observe(request)
    state = cluster()
    nodes, need = np.arange(2), np.full(2, 1000)
    first = pressure.charge(state, FLEX, nodes, need)
    assert first is not None
    assert first[0] == 0.0 and first[1] == 0.5 * 1000 * 8000 / 4000  # half the demand is T4-only; T4 half idle
    state.bind(Placement(1, (0, 1), T4_ONLY, 1000))
    later = pressure.charge(state, FLEX, nodes, need)
    assert later is not None and later[1] == 0.5 * 1000 * 6000 / 2000  # the T4s run short: it triples
    assert pressure.charge(state, T4_ONLY, nodes, need) is None  # its candidates would all pay the same


def test_nothing_changes_without_constrained_pods() -> None:
    pressure = TypePressure(weight=1.0)
    pressure.observe(FLEX)
    assert pressure.charge(cluster(), FLEX, np.arange(2), np.full(2, 1000)) is None


def test_tessera_sends_a_flexible_pod_away_from_the_type_constrained_pods_need() -> None:
    chosen = {}
    for weight in (0.0, 1.0):
        state = ClusterState([NodeSpec("t4", 64_000, 262_144, 4, "T4"), NodeSpec("g2", 64_000, 262_144, 4, "G2")])
        policy = TesseraPolicy(
            typical_pods([FLEX]), state.model_names, params=TesseraParams(type_pressure_weight=weight)
        )
        engine = Placer(state, policy)
        policy.observe(T4_ONLY)  # learnt from arrivals, as a live scheduler would; the nodes otherwise tie
        decision = engine.decide(FLEX, np.random.default_rng(0))
        assert decision is not None
        chosen[weight] = state.nodes[decision.node].name
    assert chosen == {0.0: "t4", 1.0: "g2"}
