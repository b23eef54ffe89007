"""Hypothesis: on random clusters and requests every policy keeps the books straight.

Never over-allocated, a returned placement always fits (bind accepts it), GPU-type constraints are honoured,
invariants hold after every placement, and releasing everything restores the starting state.
"""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tessera.core.cluster import ClusterState, NodeSpec
from tessera.core.fragmentation import typical_pods
from tessera.core.invariants import check_cluster
from tessera.core.placement import SETUP_NAMES, Placer, TieBreak, make_policy
from tessera.core.workload import Placement, Request

MODELS = ("T4", "V100M32", "A100-80GB")

nodes_strategy = st.lists(
    st.builds(
        lambda cpu, mem, gpus, model: (cpu * 1000, mem * 1024, gpus, model),
        st.integers(1, 96),
        st.integers(1, 512),
        st.sampled_from([0, 1, 2, 4, 8]),
        st.sampled_from(MODELS),
    ),
    min_size=1,
    max_size=12,
)


@st.composite
def requests_strategy(draw: st.DrawFn) -> Request:
    kind = draw(st.sampled_from(["cpu", "share", "whole", "multi"]))
    types = frozenset(draw(st.sets(st.sampled_from(MODELS), max_size=2)))
    cpu = draw(st.integers(0, 32)) * 1000
    mem = draw(st.integers(0, 64)) * 1024
    if kind == "cpu":
        return Request(cpu_milli=cpu, mem_mib=mem)
    if kind == "share":
        return Request(num_gpus=1, gpu_milli=draw(st.integers(1, 999)), gpu_types=types, cpu_milli=cpu, mem_mib=mem)
    gpus = 1 if kind == "whole" else draw(st.sampled_from([2, 4, 8]))
    return Request(num_gpus=gpus, gpu_milli=1000, gpu_types=types, cpu_milli=cpu, mem_mib=mem)


@settings(max_examples=60, deadline=None)
@given(
    shapes=nodes_strategy,
    requests=st.lists(requests_strategy(), min_size=1, max_size=40),
    policy=st.sampled_from(SETUP_NAMES),
    tie_break=st.sampled_from(list(TieBreak)),
)
def test_placements_fit_respect_types_and_release_restores_the_start(
    shapes: list[tuple[int, int, int, str]], requests: list[Request], policy: str, tie_break: TieBreak
) -> None:
    nodes = [
        NodeSpec(f"n{i}", cpu, mem, gpus, model if gpus else None) for i, (cpu, mem, gpus, model) in enumerate(shapes)
    ]
    state = ClusterState(nodes)
    start = (state.cpu_free_milli.copy(), state.mem_free_mib.copy(), state.gpu_free_milli.copy())
    engine = Placer(state, make_policy(policy, typical_pods(requests), state.model_names), tie_break)
    rng = np.random.default_rng(0)
    placed: list[Placement] = []
    for request in requests:
        decision = engine.decide(request, rng)
        if decision is None:
            continue
        if request.gpu_types and request.num_gpus:
            assert nodes[decision.node].gpu_model in request.gpu_types
        state.bind(decision)  # raises if the placement does not fit
        placed.append(decision)
        check_cluster(state, placed)
    for placement in reversed(placed):
        state.release(placement)
    check_cluster(state, [])
    assert np.array_equal(state.cpu_free_milli, start[0])
    assert np.array_equal(state.mem_free_mib, start[1])
    assert np.array_equal(state.gpu_free_milli, start[2])
