"""tessera-hetero: hetero's GPU model first, best fit (``within="pack"``), then Tessera's learnt measure."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tessera.core.cluster import ClusterState, NodeSpec
from tessera.core.decisions import PendingWorkload
from tessera.core.invariants import check_cluster
from tessera.core.placement import PLACEMENTS, HeteroPolicy, Placer, TieBreak, make_policy
from tessera.core.placement.hetero import packing_scores
from tessera.core.placement.tessera_hetero import TesseraHeteroPolicy, Within
from tessera.core.presets import PRESETS, REFERENCE_PRESETS, build_scheduler
from tessera.core.throughput import ColocationModel, ThroughputModel
from tessera.core.workload import Placement, Request

THROUGHPUT = ThroughputModel({("resnet", "V100M16"): 10.0, ("resnet", "P100"): 4.0, ("a3c", "V100M16"): 3.0})
# resnet gains by sharing with a3c only (net gain 0.7 + 0.6 - 1 > 0); with lm or another resnet it loses.
COLOCATION = ColocationModel(
    {
        ("resnet", "lm", "V100M16"): (0.4, 0.3),
        ("resnet", "a3c", "V100M16"): (0.7, 0.6),
        ("resnet", "resnet", "V100M16"): (0.45, 0.45),
    }
)
MODELS = ("P100", "V100M16")
RNG = np.random.default_rng(0)
HALF = Request(num_gpus=1, gpu_milli=500, cpu_milli=1_000)


def job_type(request: Request) -> str | None:
    return request.job_type or None


def policy(within: Within = "pack", colocation: ColocationModel | None = None) -> TesseraHeteroPolicy:
    return TesseraHeteroPolicy(THROUGHPUT, MODELS, job_type, colocation, within=within)


def learnt(p: TesseraHeteroPolicy, shape: Request = HALF, count: int = 64) -> TesseraHeteroPolicy:
    """``p`` after learning ``count`` workers of ``shape``: its first refit makes them the typical pod."""
    for _ in range(count):
        p.learn(shape)
    return p


def two_nodes_best_fit_cannot_tell_apart() -> ClusterState:
    """Two V100 nodes with 1,600 milli free each: [600, 1000] and [800, 800]."""
    state = ClusterState([NodeSpec("a", 64_000, 262_144, 2, "V100M16"), NodeSpec("b", 64_000, 262_144, 2, "V100M16")])
    state.bind(Placement(0, (0,), Request(num_gpus=1, gpu_milli=400), 400))
    state.bind(Placement(1, (0,), Request(num_gpus=1, gpu_milli=200), 200))
    state.bind(Placement(1, (1,), Request(num_gpus=1, gpu_milli=200), 200))
    return state


def test_among_equally_good_best_fit_nodes_the_fragmentation_measure_decides() -> None:
    share = Request(num_gpus=1, gpu_milli=300, cpu_milli=1_000)
    hetero = Placer(two_nodes_best_fit_cannot_tell_apart(), HeteroPolicy(THROUGHPUT)).decide(share, RNG)
    assert hetero is not None and (hetero.node, hetero.gpu_indices) == (0, (0,))  # the first node: 600 -> 300
    placed = Placer(two_nodes_best_fit_cannot_tell_apart(), learnt(policy())).decide(share, RNG)
    # 800 -> 500 leaves room for one more typical 500; 600 -> 300 would leave a sliver none of them fits.
    assert placed is not None and (placed.node, placed.gpu_indices) == (1, (0,))


def test_before_it_has_learnt_a_workload_it_places_like_hetero() -> None:
    share = Request(num_gpus=1, gpu_milli=300, cpu_milli=1_000)
    placed = Placer(two_nodes_best_fit_cannot_tell_apart(), policy()).decide(share, RNG)
    assert placed is not None and placed.node == 0


def test_best_fit_comes_before_the_fragmentation_measure_and_within_frag_skips_it() -> None:
    # Node a ([600, 700] free) is fuller: best fit's choice; node b's [800, 800] is where the measure puts the share.
    state = ClusterState([NodeSpec("a", 64_000, 262_144, 2, "V100M16"), NodeSpec("b", 64_000, 262_144, 2, "V100M16")])
    state.bind(Placement(0, (0,), Request(num_gpus=1, gpu_milli=400), 400))
    state.bind(Placement(0, (1,), Request(num_gpus=1, gpu_milli=300), 300))
    state.bind(Placement(1, (0,), Request(num_gpus=1, gpu_milli=200), 200))
    state.bind(Placement(1, (1,), Request(num_gpus=1, gpu_milli=200), 200))
    share = Request(num_gpus=1, gpu_milli=300, cpu_milli=1_000)
    packed = Placer(state, learnt(policy("pack"))).decide(share, RNG)
    assert packed is not None and packed.node == 0
    fragment_aware = Placer(state, learnt(policy("frag"))).decide(share, RNG)
    assert fragment_aware is not None and fragment_aware.node == 1
    shares = Placer(state, learnt(policy("shares"))).decide(share, RNG)
    assert shares is not None and shares.node == 1  # a share is ranked by the measure under "shares" too


def test_a_typed_job_takes_the_fastest_gpu_model_whatever_the_measure_prefers() -> None:
    state = ClusterState(
        [NodeSpec("p100", 64_000, 262_144, 1, "P100"), NodeSpec("v100", 64_000, 262_144, 8, "V100M16")]
    )
    for within in ("pack", "frag", "shares"):
        placed = Placer(state, learnt(policy(within))).decide(
            Request(num_gpus=1, gpu_milli=1000, job_type="resnet"), RNG
        )
        assert placed is not None and placed.node == 1


def test_a_typed_share_joins_only_a_gpu_the_colocation_rule_leaves_open() -> None:
    state = ClusterState([NodeSpec("v100", 64_000, 262_144, 2, "V100M16")])
    state.bind(Placement(0, (0,), Request(num_gpus=1, gpu_milli=500, job_type="lm"), 500))
    resnet = Request(num_gpus=1, gpu_milli=500, cpu_milli=1_000, job_type="resnet")
    free_rule = Placer(state, learnt(policy("frag"))).decide(resnet, RNG)
    assert free_rule is not None and free_rule.gpu_indices == (0,)  # the measure fills the half-used GPU
    ruled = Placer(state, learnt(policy("frag", COLOCATION))).decide(resnet, RNG)
    assert ruled is not None and ruled.gpu_indices == (1,)  # resnet next to lm is a net loss
    state.bind(ruled)
    assert Placer(state, learnt(policy("frag", COLOCATION))).decide(resnet, RNG) is None  # no open GPU is left


def test_a_bad_within_is_refused() -> None:
    with pytest.raises(ValueError, match="within"):
        TesseraHeteroPolicy(THROUGHPUT, MODELS, within="best")  # type: ignore[arg-type]


def test_the_registry_builds_it_and_the_tessera_presets_run_it() -> None:
    assert isinstance(make_policy("tessera-hetero", (), MODELS, throughput=THROUGHPUT), TesseraHeteroPolicy)
    assert "tessera-hetero" in PLACEMENTS
    assert PRESETS["tessera"].placement == "tessera-hetero"
    assert all(p.placement == "tessera-hetero" for n, p in REFERENCE_PRESETS.items() if n.startswith("tessera"))


GPU_MODELS = ("P100", "V100M16", "A100-80GB")
JOB_TYPES = ("resnet", "a3c", "lm", "")


@st.composite
def requests_strategy(draw: st.DrawFn) -> Request:
    kind = draw(st.sampled_from(["cpu", "share", "whole", "multi"]))
    cpu, kind_type = draw(st.integers(0, 16)) * 1000, draw(st.sampled_from(JOB_TYPES))
    types = frozenset(draw(st.sets(st.sampled_from(GPU_MODELS), max_size=2)))
    if kind == "cpu":
        return Request(cpu_milli=cpu)
    if kind == "share":
        milli = draw(st.sampled_from([250, 300, 500, 700]))
        return Request(num_gpus=1, gpu_milli=milli, gpu_types=types, cpu_milli=cpu, job_type=kind_type)
    gpus = 1 if kind == "whole" else draw(st.sampled_from([2, 4]))
    return Request(num_gpus=gpus, gpu_milli=1000, gpu_types=types, cpu_milli=cpu, job_type=kind_type)


@settings(max_examples=40, deadline=None)
@given(
    shapes=st.lists(st.tuples(st.sampled_from([0, 1, 2, 4, 8]), st.sampled_from(GPU_MODELS)), min_size=1, max_size=8),
    requests=st.lists(requests_strategy(), min_size=1, max_size=90),
    within=st.sampled_from(["pack", "frag", "shares"]),
)
def test_cached_scores_decide_as_fresh_ones_on_a_model_as_fast_as_heteros_and_every_placement_fits(
    shapes: list[tuple[int, str]], requests: list[Request], within: Within
) -> None:
    nodes = [
        NodeSpec(f"n{i}", 32_000, 131_072, gpus, model if gpus else None) for i, (gpus, model) in enumerate(shapes)
    ]
    state, fresh_state = ClusterState(nodes), ClusterState(nodes)
    cached = Placer(state, learnt(policy(within, COLOCATION)), TieBreak.FIRST)
    uncached_policy = learnt(policy(within, COLOCATION))
    uncached_policy.node_local = False  # the engine rescores every node on every decision
    fresh = Placer(fresh_state, uncached_policy, TieBreak.FIRST)
    hetero_placer = Placer(state, HeteroPolicy(THROUGHPUT, job_type, colocation=COLOCATION), TieBreak.FIRST)
    placed: list[Placement] = []
    for request in requests:
        decision = cached.decide(request, RNG)
        assert decision == fresh.decide(request, RNG)
        hetero = hetero_placer.decide(request, RNG)
        assert (decision is None) == (hetero is None)  # the same nodes are open to it as to hetero
        if decision is None or hetero is None:
            continue
        if request.job_type and request.num_gpus:  # on a GPU model as fast as hetero's choice
            speed = THROUGHPUT.throughput(request.job_type, str(nodes[decision.node].gpu_model))
            assert speed == THROUGHPUT.throughput(request.job_type, str(nodes[hetero.node].gpu_model))
        if within == "pack":  # and as good a best fit: only hetero's ties are decided differently
            at = np.array([decision.node, hetero.node])
            pack = packing_scores(state, request, at, state.milli_by_model(request)[state.model_idx[at]])
            assert pack[0] == pack[1]
        state.bind(decision)
        fresh_state.bind(decision)
        placed.append(decision)
        check_cluster(state, placed)


def test_before_its_first_model_a_share_takes_the_best_fitting_gpu_as_with_hetero() -> None:
    state = ClusterState([NodeSpec("a", 64_000, 262_144, 2, "V100M16")])
    state.bind(Placement(0, (1,), Request(num_gpus=1, gpu_milli=400), 400))  # free [1000, 600]
    share = Request(num_gpus=1, gpu_milli=300, cpu_milli=1_000)
    hetero = Placer(state, HeteroPolicy(THROUGHPUT)).decide(share, RNG)
    placed = Placer(state, policy()).decide(share, RNG)
    assert hetero is not None and placed is not None and placed.gpu_indices == hetero.gpu_indices == (1,)


def workloads(count: int, gang: int = 1) -> list[PendingWorkload]:
    request = Request(num_gpus=1, gpu_milli=1000, cpu_milli=1_000)
    return [PendingWorkload(f"w{i}", request, float(i), gang=gang) for i in range(count)]


def test_the_scheduler_teaches_each_worker_of_a_workload_once_however_often_it_steps() -> None:
    state = ClusterState([NodeSpec(f"n{i}", 64_000, 262_144, 8, "V100M16") for i in range(8)])
    scheduler = build_scheduler(PRESETS["tessera"], state)
    placement = scheduler.placer.policy
    assert isinstance(placement, TesseraHeteroPolicy)
    pending = workloads(64)  # 64 workers: one refit; taught at every placement attempt, two in three steps
    for _ in range(3):  # planned, never committed: as a runtime's steps while nothing changes
        assert len(scheduler.plan(pending, 0.0).binds) == 64
    assert placement.model_version == 1


def test_a_finished_workload_is_forgotten_and_an_adopted_one_taught() -> None:
    state = ClusterState([NodeSpec("a", 64_000, 262_144, 8, "V100M16")])
    scheduler = build_scheduler(PRESETS["tessera"], state)
    placement = scheduler.placer.policy
    assert isinstance(placement, TesseraHeteroPolicy)
    taught: list[Request] = []
    placement.learn = taught.append  # type: ignore[method-assign,assignment]
    first = workloads(1)
    scheduler.plan(first, 0.0)
    scheduler.plan(first, 1.0)
    assert len(taught) == 1
    scheduler.observe(["w0"], 2.0)
    scheduler.plan(first, 3.0)  # an id that ended and comes back is a new workload
    assert len(taught) == 2
    scheduler.adopt(workloads(2)[1], (Placement(0, (0,), first[0].request, 1000),), None, 4.0)
    assert len(taught) == 3
