"""ClusterState bookkeeping: per-GPU free vectors, feasibility rules and version bumps."""

import numpy as np
import pytest

from tessera.core.catalog import resolve_allowed, resolve_model
from tessera.core.cluster import ClusterState, NodeSpec
from tessera.core.errors import InvalidRequestError, UnknownGpuModelError
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
