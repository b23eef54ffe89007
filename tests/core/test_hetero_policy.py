"""Heterogeneity-aware placement: fastest GPU type for the job type first, best-fit packing among equals."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tessera.core.cluster import ClusterState, IntArray, NodeSpec
from tessera.core.errors import InvalidRequestError
from tessera.core.invariants import check_cluster
from tessera.core.placement import (
    HETERO_POLICIES,
    SETUP_NAMES,
    HeteroPolicy,
    Placer,
    TieBreak,
    make_policy,
    should_colocate,
)
from tessera.core.placement.bestfit import BestFitPolicy
from tessera.core.throughput import ColocationModel, ThroughputModel
from tessera.core.workload import Placement, Request

# Gavel-like: resnet gains a lot from a V100; a3c barely cares which GPU it runs on.
THROUGHPUT = ThroughputModel(
    {
        ("resnet", "V100M16"): 10.0,
        ("resnet", "P100"): 4.0,
        ("resnet", "K80"): 1.0,
        ("a3c", "V100M16"): 3.0,
        ("a3c", "P100"): 3.0,
        ("a3c", "K80"): 2.0,
    }
)

RESNET = Request(num_gpus=1, gpu_milli=1000, cpu_milli=4_000, queue="resnet")
A3C = Request(num_gpus=1, gpu_milli=1000, cpu_milli=4_000, queue="a3c")
UNKNOWN = Request(num_gpus=1, gpu_milli=1000, cpu_milli=4_000, queue="nobody")
RNG = np.random.default_rng(0)


def job_type_by_queue(request: Request) -> str | None:
    """The tests tag a request's job type through its queue name; ``nobody`` has none."""
    return None if request.queue in ("nobody", "default") else request.queue


def hetero(speed_tolerance: float = 0.0) -> HeteroPolicy:
    return HeteroPolicy(THROUGHPUT, job_type_by_queue, speed_tolerance=speed_tolerance)


def mixed_cluster() -> ClusterState:
    # The V100 node is the emptiest, so best-fit alone would pick a fuller P100 node.
    return ClusterState(
        [
            NodeSpec("p100-a", 64_000, 262_144, 4, "P100"),
            NodeSpec("v100", 64_000, 262_144, 8, "V100M16"),
            NodeSpec("p100-b", 64_000, 262_144, 2, "P100"),
        ]
    )


def decide(state: ClusterState, policy: HeteroPolicy | BestFitPolicy, request: Request) -> int:
    decision = Placer(state, policy).decide(request, RNG)
    assert decision is not None
    return decision.node


def test_a_job_type_that_gains_from_a_v100_goes_to_the_v100_node() -> None:
    state = mixed_cluster()
    assert decide(state, BestFitPolicy(), RESNET) == 2  # packing alone prefers the small P100 node
    assert decide(state, hetero(), RESNET) == 1


def test_a_v100_hungry_job_still_takes_a_p100_when_the_v100s_are_full() -> None:
    state = mixed_cluster()
    state.bind(Placement(1, tuple(range(8)), Request(num_gpus=8, gpu_milli=1000), 1000))
    assert decide(state, hetero(), RESNET) == 2  # among the equally fast P100 nodes: best fit


def test_equally_fast_gpus_pack_like_bestfit() -> None:
    state = mixed_cluster()
    state.bind(Placement(0, (0, 1), Request(num_gpus=2, gpu_milli=1000, cpu_milli=8_000), 1000))
    # a3c runs as fast on a P100 as on a V100: all three nodes tie on speed, so packing decides.
    assert decide(state, hetero(), A3C) == decide(state, BestFitPolicy(), A3C)


def test_a_tolerance_counts_nearly_equal_speeds_as_equal() -> None:
    state = ClusterState([NodeSpec("v100", 64_000, 262_144, 8, "V100M16"), NodeSpec("p", 64_000, 262_144, 1, "P100")])
    model = ThroughputModel({("lm", "V100M16"): 10.0, ("lm", "P100"): 9.6})
    strict = HeteroPolicy(model, job_type_by_queue)
    tolerant = HeteroPolicy(model, job_type_by_queue, speed_tolerance=0.05)
    request = Request(num_gpus=1, gpu_milli=1000, queue="lm")
    assert decide(state, strict, request) == 0
    assert decide(state, tolerant, request) == 1  # 4 % slower counts as equal: best fit takes the 1-GPU node


def test_unknown_job_type_falls_back_to_bestfit() -> None:
    state = mixed_cluster()
    assert decide(state, hetero(), UNKNOWN) == decide(state, BestFitPolicy(), UNKNOWN) == 2
    no_reader = HeteroPolicy(THROUGHPUT)
    assert decide(state, no_reader, RESNET) == 2


def test_an_unmeasured_job_type_is_ranked_by_relative_gpu_speed() -> None:
    state = mixed_cluster()
    request = Request(num_gpus=1, gpu_milli=1000, queue="never-measured")
    assert decide(state, hetero(), request) == 1  # V100 is faster than a P100 in the catalog


def test_a_sharing_request_goes_to_the_fast_node_and_best_fits_its_gpu() -> None:
    state = mixed_cluster()
    state.bind(Placement(1, (3,), Request(num_gpus=1, gpu_milli=600), 600))
    decision = Placer(state, hetero()).decide(Request(num_gpus=1, gpu_milli=300, queue="resnet"), RNG)
    assert decision is not None and (decision.node, decision.gpu_indices) == (1, (3,))


def test_bad_tolerance_names_the_field() -> None:
    with pytest.raises(InvalidRequestError) as info:
        hetero(speed_tolerance=1.0)
    assert info.value.field == "speed_tolerance"


def test_make_policy_builds_hetero_without_listing_it_in_policy_names() -> None:
    assert HETERO_POLICIES == ("hetero",)
    assert "hetero" not in SETUP_NAMES
    policy = make_policy("hetero", throughput=THROUGHPUT, job_type_of=job_type_by_queue)
    assert isinstance(policy, HeteroPolicy) and policy.node_local
    assert decide(mixed_cluster(), policy, RESNET) == 1
    assert isinstance(make_policy("hetero"), HeteroPolicy)


def test_should_colocate_uses_the_net_gain() -> None:
    colocation = ColocationModel(
        {
            ("resnet", "a3c", "V100M16"): (0.7, 0.6),  # net gain 0.3: worth sharing
            ("resnet", "lm", "V100M16"): (0.5, 0.4),  # net gain -0.1: not worth it
            ("lm", "a3c", "V100M16"): (0.5, 0.5),  # net gain 0: no gain, no sharing
        }
    )
    assert should_colocate(colocation, "resnet", "a3c", "v100")
    assert should_colocate(colocation, "a3c", "resnet", "V100M16")  # either order
    assert not should_colocate(colocation, "resnet", "lm", "V100M16")
    assert not should_colocate(colocation, "lm", "a3c", "V100M16")


MODELS = ("T4", "P100", "V100M16", "A100-80GB")
JOB_TYPES = ("resnet", "a3c", "never-measured", "nobody")


@st.composite
def requests_strategy(draw: st.DrawFn) -> Request:
    kind = draw(st.sampled_from(["cpu", "share", "whole", "multi"]))
    types = frozenset(draw(st.sets(st.sampled_from(MODELS), max_size=2)))
    cpu = draw(st.integers(0, 32)) * 1000
    mem = draw(st.integers(0, 64)) * 1024
    queue = draw(st.sampled_from(JOB_TYPES))
    if kind == "cpu":
        return Request(cpu_milli=cpu, mem_mib=mem, queue=queue)
    if kind == "share":
        milli = draw(st.integers(1, 999))
        return Request(num_gpus=1, gpu_milli=milli, gpu_types=types, cpu_milli=cpu, mem_mib=mem, queue=queue)
    gpus = 1 if kind == "whole" else draw(st.sampled_from([2, 4, 8]))
    return Request(num_gpus=gpus, gpu_milli=1000, gpu_types=types, cpu_milli=cpu, mem_mib=mem, queue=queue)


@settings(max_examples=60, deadline=None)
@given(
    shapes=st.lists(
        st.tuples(st.integers(1, 96), st.integers(1, 512), st.sampled_from([0, 1, 2, 4, 8]), st.sampled_from(MODELS)),
        min_size=1,
        max_size=12,
    ),
    requests=st.lists(requests_strategy(), min_size=1, max_size=40),
    tolerance=st.sampled_from([0.0, 0.1]),
    tie_break=st.sampled_from(list(TieBreak)),
)
def test_every_hetero_placement_fits_respects_gpu_types_and_takes_a_fastest_gpu(
    shapes: list[tuple[int, int, int, str]], requests: list[Request], tolerance: float, tie_break: TieBreak
) -> None:
    nodes = [
        NodeSpec(f"n{i}", cpu * 1000, mem * 1024, gpus, model if gpus else None)
        for i, (cpu, mem, gpus, model) in enumerate(shapes)
    ]
    state = ClusterState(nodes)
    engine = Placer(state, hetero(speed_tolerance=tolerance), tie_break)
    placed: list[Placement] = []
    for request in requests:
        feasible = np.flatnonzero(state.feasible(request, np.arange(state.num_nodes), engine_need(state, request)))
        decision = engine.decide(request, RNG)
        if decision is None:
            assert feasible.size == 0
            continue
        job_type = job_type_by_queue(request)
        if job_type is not None and request.num_gpus:  # never a clearly slower GPU than a feasible one
            speeds = [THROUGHPUT.throughput(job_type, str(nodes[n].gpu_model)) for n in feasible]
            chosen = THROUGHPUT.throughput(job_type, str(nodes[decision.node].gpu_model))
            assert chosen >= max(speeds) * (1.0 - tolerance - 0.002)
        if request.gpu_types and request.num_gpus:
            assert nodes[decision.node].gpu_model in request.gpu_types
        state.bind(decision)  # raises if the placement does not fit
        placed.append(decision)
        check_cluster(state, placed)


def engine_need(state: ClusterState, request: Request) -> IntArray:
    return state.milli_by_model(request)[state.model_idx]


# ------------------------------------------------------------------------------------------ co-location rule

# resnet + a3c gain by sharing (0.7 + 0.6 - 1 > 0); resnet + lm and lm + a3c lose (0.4 + 0.3 - 1 < 0).
COLOCATION = ColocationModel(
    {
        ("resnet", "a3c", "V100M16"): (0.7, 0.6),
        ("resnet", "lm", "V100M16"): (0.4, 0.3),
        ("lm", "a3c", "V100M16"): (0.5, 0.4),
        ("resnet", "resnet", "V100M16"): (0.55, 0.55),
    }
)


def half(job_type: str, milli: int = 500) -> Request:
    return Request(num_gpus=1, gpu_milli=milli, cpu_milli=1_000, job_type=job_type)


def colocating(colocation: ColocationModel | None = COLOCATION) -> HeteroPolicy:
    return HeteroPolicy(THROUGHPUT, lambda r: r.job_type or None, colocation=colocation)


def v100_node(gpus: int = 2) -> ClusterState:
    return ClusterState([NodeSpec("v100", 64_000, 262_144, gpus, "V100M16")])


def test_a_share_avoids_a_gpu_whose_partner_would_make_sharing_a_net_loss() -> None:
    state = v100_node()
    state.bind(Placement(0, (0,), half("lm", 400), 400))
    # Best-fit alone joins the lm job on GPU 0 (least free); the rule sends resnet to the empty GPU 1.
    assert Placer(state, colocating(None)).decide(half("resnet"), RNG).gpu_indices == (0,)  # type: ignore[union-attr]
    assert Placer(state, colocating()).decide(half("resnet"), RNG).gpu_indices == (1,)  # type: ignore[union-attr]


def test_a_share_joins_a_partner_when_sharing_is_a_net_gain() -> None:
    state = v100_node()
    state.bind(Placement(0, (0,), half("a3c", 400), 400))
    assert Placer(state, colocating()).decide(half("resnet"), RNG).gpu_indices == (0,)  # type: ignore[union-attr]


def test_a_node_whose_only_open_room_is_next_to_a_losing_partner_is_infeasible() -> None:
    state = ClusterState(
        [NodeSpec("v100-a", 64_000, 262_144, 1, "V100M16"), NodeSpec("v100-b", 64_000, 262_144, 1, "V100M16")]
    )
    state.bind(Placement(0, (0,), half("lm", 300), 300))
    state.bind(Placement(1, (0,), half("a3c", 300), 300))
    placement = Placer(state, colocating()).decide(half("resnet"), RNG)
    assert placement is not None and placement.node == 1  # best-fit would tie; only the a3c GPU is open
    state.bind(placement)
    assert Placer(state, colocating()).decide(half("resnet", 300), RNG) is None  # lm loses, a3c's GPU holds a pair


def test_requests_without_a_job_type_are_neither_constrained_nor_partners() -> None:
    state = v100_node(1)
    service = Request(num_gpus=1, gpu_milli=300, cpu_milli=1_000)
    state.bind(Placement(0, (0,), service, 300))
    state.bind(Placement(0, (0,), half("lm", 300), 300))
    # The service does not count: the GPU holds one typed partner (lm), which resnet would lose against.
    assert Placer(state, colocating()).decide(half("resnet", 300), RNG) is None
    assert Placer(state, colocating()).decide(service, RNG) is not None


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["resnet", "a3c", "lm", ""]), st.sampled_from([200, 300, 500])), max_size=40))
def test_no_gpu_ever_holds_a_pair_that_loses_or_more_than_two_typed_jobs(arrivals: list[tuple[str, int]]) -> None:
    state = ClusterState(
        [NodeSpec("v100", 64_000, 262_144, 4, "V100M16"), NodeSpec("v100-b", 64_000, 262_144, 2, "V100M16")]
    )
    placer = Placer(state, colocating())
    placed = 0
    for job_type, milli in arrivals:
        placement = placer.decide(Request(num_gpus=1, gpu_milli=milli, cpu_milli=1_000, job_type=job_type), RNG)
        if placement is not None:
            state.bind(placement)
            placed += 1
    check_cluster(state)
    for (node, _), types in state.gpu_job_types.items():
        assert 1 <= len(types) <= 2
        if len(types) == 2:
            assert should_colocate(COLOCATION, types[0], types[1], state.nodes[node].gpu_model or "")
    typed = sum(1 for job_type, _ in arrivals if job_type)
    assert sum(len(t) for t in state.gpu_job_types.values()) <= typed
