"""The compiled scoring (``tessera_jit``) gives tessera's NumPy scoring's numbers bit for bit.

Each test runs the same random cluster states and requests through three ``TesseraPolicy`` objects that differ only
in how they score: the NumPy code (``use_kernels(None)``), the compiled loops, and the same loops uncompiled (the
module's plain Python functions, which is also what line coverage sees of them).
"""

import dataclasses
from typing import Any, cast

import numpy as np
import pytest

from tessera.core.cluster import ClusterState
from tessera.core.fragmentation import typical_pods
from tessera.core.placement import tessera_jit
from tessera.core.placement.tessera import TesseraParams, TesseraPolicy
from tessera.core.workload import MILLI_PER_GPU, Request
from tessera.sim.placement_study.inputs import default_inputs

COMPILED = tessera_jit.compiled()
UNCOMPILED = cast(tessera_jit.Kernels, tessera_jit)  # the plain functions, under the same names


def _random_state(state: ClusterState, rng: np.random.Generator) -> None:
    free = rng.choice([0, 50, 100, 250, 300, 500, 700, 1000, 1000, 1000], size=state.gpu_free_milli.shape)
    state.gpu_free_milli[:] = np.where(state.gpu_exists, free, 0)
    state.cpu_free_milli[:] = (state.cpu_cap_milli * rng.random(state.num_nodes)).astype(np.int64)
    state.mem_free_mib[:] = (state.mem_cap_mib * rng.random(state.num_nodes)).astype(np.int64)
    state.version += 1


def _requests(rng: np.random.Generator, models: tuple[str, ...]) -> list[Request]:
    out = []
    for _ in range(10):
        kind = rng.integers(5)
        cpu, mem = int(rng.integers(0, 16)) * 1000, int(rng.integers(0, 64)) * 1024
        if kind == 0:  # CPU only; no CPU at all is scored as the Kubernetes non-zero default
            out.append(Request(cpu_milli=cpu, mem_mib=mem))
        elif kind == 1:
            out.append(Request(num_gpus=1, gpu_milli=int(rng.choice([100, 250, 300, 500, 810])), cpu_milli=cpu))
        elif kind == 2:
            out.append(Request(num_gpus=int(rng.choice([1, 2, 4, 8])), gpu_milli=MILLI_PER_GPU, cpu_milli=cpu))
        elif kind == 3:  # a share on a large model, a whole GPU on a small one
            out.append(Request(num_gpus=1, gpu_mem_mib=int(rng.choice([6_000, 12_000, 20_000])), cpu_milli=cpu))
        else:
            out.append(Request(num_gpus=1, gpu_milli=500, cpu_milli=cpu, gpu_types=frozenset(models[:2])))
    return out


def _policies(
    state: ClusterState, params: TesseraParams | None = None, typed: bool = False
) -> dict[str, TesseraPolicy]:
    """The three scorings; ``typed``: every third typical GPU pod may run on the cluster's first GPU model only."""
    inputs = default_inputs()
    typical = typical_pods(inputs.requests)
    if typed:
        only = frozenset(state.model_names[:1])
        typical = tuple(
            dataclasses.replace(p, gpu_types=only) if p.num_gpus and i % 3 == 0 else p for i, p in enumerate(typical)
        )
    out = {}
    for name, kernels in (("numpy", None), ("compiled", COMPILED), ("python", UNCOMPILED)):
        policy = TesseraPolicy(typical, state.model_names, params=params or TesseraParams())
        policy.use_kernels(kernels)
        for request in inputs.requests[:600] + [r for r in inputs.requests if r.num_gpus >= 2]:
            policy.observe(request)  # the reserve learns the multi-GPU shapes
        out[name] = policy
    return out


def test_compiled_functions_are_available() -> None:
    assert COMPILED is not None  # numba is a dependency: the compiled path is what runs


@pytest.mark.parametrize("params", [TesseraParams(), TesseraParams(joint_weight=0.0, memory=False)])
def test_scores_gpus_kept_frag_and_lost_shapes_are_the_same_bit_for_bit(params: TesseraParams) -> None:
    inputs = default_inputs()
    rng = np.random.default_rng(21)
    state = ClusterState(inputs.nodes)
    policies = _policies(state, params)
    compared = sharing = lost = 0
    for _ in range(8):
        _random_state(state, rng)
        for request in _requests(rng, state.model_names):
            need = state.milli_by_model(request)[state.model_idx]
            every = np.arange(state.num_nodes)
            feasible = every[state.feasible(request, every, need)]
            for nodes in (feasible[: rng.integers(1, 5)], feasible[rng.random(feasible.size) < 0.05], feasible):
                if nodes.size == 0:
                    continue
                results: dict[str, Any] = {}
                for name, policy in policies.items():
                    if name == "python" and nodes.size > 40:
                        continue  # plain Python loops: small batches only
                    scored = policy.score_nodes(state, request, nodes, need[nodes])
                    bits, known = policy._lost.arrays(state, request)
                    results[name] = (
                        scored.score.tolist(),
                        scored.gpu.tolist(),
                        policy._known.frag[nodes].tolist(),
                        bits[nodes].tolist(),
                        known[nodes].tolist(),
                    )
                want = results.pop("numpy")
                for got in results.values():
                    assert got == want
                compared += nodes.size
                sharing += sum(g >= 0 for g in want[1])
                lost += sum(b != 0 for b in want[3])
    assert compared > 5_000 and sharing > 500 and lost > 50  # every kind of placement, and lost shapes


def test_reserve_charges_and_final_scores_are_the_same_bit_for_bit() -> None:
    inputs = default_inputs()
    rng = np.random.default_rng(22)
    state = ClusterState(inputs.nodes)
    policies = _policies(state)
    charged = 0
    for _ in range(10):
        _random_state(state, rng)
        state.gpu_free_milli[:] = np.where(rng.random(state.gpu_free_milli.shape) < 0.7, 1000, state.gpu_free_milli)
        state.gpu_free_milli[~state.gpu_exists] = 0
        for request in _requests(rng, state.model_names):
            need = state.milli_by_model(request)[state.model_idx]
            every = np.arange(state.num_nodes)
            nodes = every[state.feasible(request, every, need)][:40]
            if nodes.size == 0:
                continue
            finals = {}
            shapes = policies["numpy"].reserve.shapes
            bits = rng.integers(0, 1 << shapes, size=int(rng.integers(1, 4)))
            for name, policy in policies.items():
                scored = policy.score_nodes(state, request, nodes, need[nodes])
                finals[name] = policy.adjust(state, request, nodes, need[nodes], scored).tolist()
                finals[name + " charge"] = policy.reserve.charge_bits(state, bits).tolist()
            for name in ("compiled", "python"):
                assert finals[name] == finals["numpy"]
                assert finals[name + " charge"] == finals["numpy charge"]
            charged += (
                finals["numpy"] != policies["numpy"].score_nodes(state, request, nodes, need[nodes]).score.tolist()
            )
    assert charged


@pytest.mark.parametrize("gpus", [4, 12, 16])
def test_gpu_counts_and_typed_pods_give_the_same_numbers(gpus: int) -> None:
    """Below eight values NumPy sums one by one, from eight on pairwise (eight running sums, then the rest one by
    one); typical pods bound to one GPU model count all idle milli elsewhere."""
    inputs = default_inputs()
    nodes = [dataclasses.replace(n, gpu_count=gpus) for n in inputs.nodes[:60] if n.gpu_model]
    state = ClusterState(nodes)
    assert len(state.model_names) > 1
    rng = np.random.default_rng(23)
    policies = _policies(state, typed=True)
    for _ in range(5):
        _random_state(state, rng)
        for request in _requests(rng, state.model_names):
            need = state.milli_by_model(request)[state.model_idx]
            every = np.arange(state.num_nodes)
            feasible = every[state.feasible(request, every, need)]
            if feasible.size == 0:
                continue
            got = {
                name: policy.score_nodes(state, request, feasible, need[feasible]).score.tolist()
                for name, policy in policies.items()
            }
            assert got["compiled"] == got["numpy"] == got["python"]
