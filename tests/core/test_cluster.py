"""ClusterState bookkeeping: per-GPU free vectors, feasibility rules and version bumps."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tessera.core.catalog import resolve_allowed, resolve_model
from tessera.core.cluster import ClusterState, NodeSpec
from tessera.core.errors import InvalidRequestError, UnknownGpuModelError
from tessera.core.invariants import check_cluster
from tessera.core.placement import Placer, TieBreak, make_policy
from tessera.core.workload import Placement, Request


def two_nodes() -> ClusterState:
    return ClusterState([NodeSpec("a", 32_000, 65_536, 4, "T4"), NodeSpec("b", 8_000, 16_384, 2, "V100M32")])


def feasible(state: ClusterState, request: Request) -> list[bool]:
    nodes = np.arange(state.num_nodes)
    need = state.milli_by_model(request)[state.model_idx]
    return [bool(x) for x in state.feasible(request, nodes, need)]


def test_a_share_needs_one_gpu_with_that_much_free_not_a_node_total() -> None:
    state = two_nodes()
    for gpu in range(4):
        state.bind(Placement(0, (gpu,), Request(num_gpus=1, gpu_milli=800), 800))
    # Node a has 0.8 GPU free in total (4 x 0.2) but no single GPU with 0.3 free.
    assert feasible(state, Request(num_gpus=1, gpu_milli=300)) == [False, True]


def test_whole_gpu_requests_need_completely_free_gpus() -> None:
    state = two_nodes()
    state.bind(Placement(1, (0,), Request(num_gpus=1, gpu_milli=100), 100))
    assert feasible(state, Request(num_gpus=2, gpu_milli=1000)) == [True, False]
    assert feasible(state, Request(num_gpus=1, gpu_milli=1000)) == [True, True]


def test_cpu_memory_and_gpu_type_constraints_filter_nodes() -> None:
    state = two_nodes()
    assert feasible(state, Request(cpu_milli=16_000)) == [True, False]
    assert feasible(state, Request(mem_mib=20_000)) == [True, False]
    only_v100 = Request(num_gpus=1, gpu_milli=500, gpu_types=resolve_allowed("V100M32"))
    assert feasible(state, only_v100) == [False, True]


def test_memory_request_becomes_a_share_of_the_chosen_model() -> None:
    state = two_nodes()
    request = Request(num_gpus=1, gpu_mem_mib=8 * 1024)
    milli = state.milli_by_model(request)
    assert milli[state.model_names.index("T4")] == 500  # half of 16 GiB
    assert milli[state.model_names.index("V100M32")] == 250  # a quarter of 32 GiB


def test_bind_rejects_an_overdraft_and_changes_nothing() -> None:
    state = two_nodes()
    before = state.gpu_free_milli.copy()
    with pytest.raises(InvalidRequestError):
        state.bind(Placement(1, (0, 1, 1), Request(num_gpus=3, gpu_milli=1000), 1000))
    assert np.array_equal(before, state.gpu_free_milli)


def test_bind_and_release_bump_the_node_version() -> None:
    state = two_nodes()
    placement = Placement(0, (1,), Request(num_gpus=1, gpu_milli=250, cpu_milli=1000), 250)
    state.bind(placement)
    state.release(placement)
    assert state.version.tolist() == [2, 0]
    assert state.gpu_free_milli[0].tolist() == [1000, 1000, 1000, 1000]
    assert state.gpu_kinds[0] == {}


def test_catalog_resolves_aliases_and_families_and_rejects_unknown_names() -> None:
    assert resolve_model("h100").name == "H100-80GB"
    assert resolve_allowed("A100") == {"A100-40GB", "A100-80GB"}
    assert resolve_allowed("T4|V100M32") == {"T4", "V100M32"}
    with pytest.raises(UnknownGpuModelError):
        resolve_model("Z9000")


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"num_gpus": -1}, "num_gpus"),
        ({"num_gpus": 1, "gpu_milli": 1001}, "gpu_milli"),
        ({"num_gpus": 2, "gpu_milli": 500}, "gpu_milli"),
        ({"num_gpus": 0, "gpu_milli": 500}, "num_gpus"),
        ({"num_gpus": 1}, "gpu_milli"),
        ({"cpu_milli": -5}, "cpu_milli"),
    ],
)
def test_invalid_requests_name_the_field(kwargs: dict[str, int], field: str) -> None:
    with pytest.raises(InvalidRequestError) as info:
        Request(**kwargs)  # type: ignore[arg-type]
    assert info.value.field == field


def test_the_state_records_the_job_types_of_sharing_workloads_per_gpu_and_forgets_them_on_release() -> None:
    state = ClusterState([NodeSpec("n", 16_000, 65_536, 2, "V100M16")])
    a = Placement(0, (1,), Request(num_gpus=1, gpu_milli=400, cpu_milli=1_000, job_type="resnet"), 400)
    b = Placement(0, (1,), Request(num_gpus=1, gpu_milli=400, cpu_milli=1_000, job_type="a3c"), 400)
    whole = Placement(0, (0,), Request(num_gpus=1, gpu_milli=1000, cpu_milli=1_000, job_type="lm"), 1000)
    for placement in (a, b, whole):
        state.bind(placement)
    assert state.job_types_on(0, 1) == ["resnet", "a3c"] and state.job_types_on(0, 0) == []  # whole GPUs never share
    state.release(a)
    assert state.job_types_on(0, 1) == ["a3c"]
    state.release(b)
    state.release(whole)
    assert state.gpu_job_types == {}


# ------------------------------------------------------------------------------------ nodes that join and leave


def test_an_added_node_gets_the_next_index_and_wider_arrays_keep_old_nodes_intact() -> None:
    state = two_nodes()
    state.bind(Placement(0, (2,), Request(num_gpus=1, gpu_milli=300), 300))
    before = state.gpu_free_milli.copy()
    index = state.add_node(NodeSpec("c", 64_000, 131_072, 8, "T4"))
    assert index == 2 and state.num_nodes == 3 and state.max_gpus == 8 and state.total_gpus == 14
    assert state.gpu_free_milli.shape == (3, 8)
    assert np.array_equal(state.gpu_free_milli[:2, :4], before)  # old nodes unchanged, new slots are padding
    assert not state.gpu_exists[:2, 4:].any() and state.gpu_free_milli[2].tolist() == [1000] * 8
    assert state.model_idx[2] == state.model_idx[0]
    check_cluster(state, [Placement(0, (2,), Request(num_gpus=1, gpu_milli=300), 300)])
    assert feasible(state, Request(num_gpus=8, gpu_milli=1000)) == [False, False, True]


def test_a_node_of_an_unknown_model_needs_the_model_declared_up_front() -> None:
    with pytest.raises(InvalidRequestError, match="H100-80GB"):
        two_nodes().add_node(NodeSpec("h", 8_000, 16_384, 1, "H100-80GB"))
    state = ClusterState([NodeSpec("a", 8_000, 16_384, 1, "T4")], models=["H100-80GB"])
    assert state.model_names == ("H100-80GB", "T4")
    node = state.add_node(NodeSpec("h", 8_000, 16_384, 1, "H100-80GB"))
    assert state.nodes[node].gpu_model == state.model_names[state.model_idx[node]]
    cpu_only = state.add_node(NodeSpec("cpu", 8_000, 16_384, 0, None))
    assert state.model_idx[cpu_only] == len(state.model_names)
    with pytest.raises(InvalidRequestError, match="already"):
        state.add_node(NodeSpec("h", 8_000, 16_384, 1, "H100-80GB"))


def test_a_drained_node_takes_nothing_new_but_keeps_what_runs() -> None:
    state = two_nodes()
    running = Placement(1, (0,), Request(num_gpus=1, gpu_milli=500), 500)
    state.bind(running)
    version = int(state.version[1])
    state.drain(1)
    assert state.version[1] == version + 1
    assert feasible(state, Request(num_gpus=1, gpu_milli=100)) == [True, False]
    assert feasible(state, Request(cpu_milli=100)) == [True, False]
    state.release(running)  # what ran there ends as usual
    assert state.gpu_free_milli[1].tolist() == [1000, 1000, 0, 0]
    state.undrain(1)
    assert feasible(state, Request(num_gpus=1, gpu_milli=100)) == [True, True]


def test_a_node_is_removed_only_when_empty_and_its_index_stays_reserved() -> None:
    state = two_nodes()
    running = Placement(0, (), Request(cpu_milli=0, mem_mib=0), 0)  # holds nothing, still counts as bound
    state.bind(running)
    with pytest.raises(InvalidRequestError, match="holds 1 placements"):
        state.remove_node(0)
    state.release(running)
    state.remove_node(0)
    assert state.num_nodes == 2 and state.gone.tolist() == [True, False] and state.total_gpus == 2
    assert state.gpu_free_milli[0].sum() == 0 and state.cpu_cap_milli[0] == 0 and state.gpu_count[0] == 0
    assert feasible(state, Request(cpu_milli=0)) == [False, True]
    check_cluster(state, [])
    for act in (state.drain, state.undrain, state.remove_node):
        with pytest.raises(InvalidRequestError, match="removed"):
            act(0)
    with pytest.raises(InvalidRequestError, match="not in the cluster"):
        state.bind(Placement(0, (), Request(), 0))
    assert state.add_node(NodeSpec("a", 32_000, 65_536, 4, "T4")) == 2  # back, at a new index


@pytest.mark.parametrize("policy", ["bestfit", "tessera", "fgd", "packing"])
def test_the_placer_lands_on_an_added_node_and_never_on_a_drained_or_removed_one(policy: str) -> None:
    state = ClusterState([NodeSpec("a", 8_000, 16_384, 1, "T4"), NodeSpec("b", 8_000, 16_384, 1, "T4")])
    placer = Placer(state, make_policy(policy, (), state.model_names), TieBreak.FIRST)
    rng = np.random.default_rng(0)
    whole = Request(num_gpus=1, gpu_milli=1000, cpu_milli=1_000)
    first = placer.decide(whole, rng)  # fills the score cache for this shape
    assert first is not None
    state.bind(first)
    state.drain(1 - first.node)  # the other node
    assert placer.decide(whole, rng) is None
    added = state.add_node(NodeSpec("c", 8_000, 16_384, 1, "T4"))
    second = placer.decide(whole, rng)
    assert second is not None and second.node == added
    state.bind(second)
    state.release(first)
    state.drain(first.node)
    state.undrain(1 - first.node)
    state.remove_node(1 - first.node)
    assert placer.decide(whole, rng) is None  # a: drained, b: removed, c: full
    check_cluster(state, [second])


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["add", "drain", "undrain", "remove", "place", "end"]), st.integers(0, 9))))
def test_random_joins_drains_and_leaves_keep_the_books_and_placements_off_unschedulable_nodes(
    actions: list[tuple[str, int]],
) -> None:
    state = ClusterState([NodeSpec("n0", 8_000, 16_384, 2, "T4")], models=["A100-80GB"])
    placer = Placer(state, make_policy("tessera", (), state.model_names), TieBreak.FIRST)
    rng = np.random.default_rng(0)
    shapes = [Request(num_gpus=1, gpu_milli=400, cpu_milli=1_000), Request(num_gpus=2, gpu_milli=1000)]
    placed: list[Placement] = []
    for action, k in actions:
        node = k % state.num_nodes
        if action == "add":
            model = ("T4", "A100-80GB")[k % 2]
            state.add_node(NodeSpec(f"n{state.num_nodes}", 8_000 * (k + 1), 16_384, k % 5, model if k % 5 else None))
        elif action in ("drain", "undrain") and not state.gone[node]:
            getattr(state, action)(node)
        elif action == "remove" and not state.gone[node] and state.bound[node] == 0:
            state.remove_node(node)
        elif action == "place":
            decision = placer.decide(shapes[k % 2], rng)
            if decision is not None:
                assert not state.drained[decision.node] and not state.gone[decision.node]
                state.bind(decision)
                placed.append(decision)
        elif action == "end" and placed:
            state.release(placed.pop(k % len(placed)))
        check_cluster(state, placed)
