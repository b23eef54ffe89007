"""The compiled scoring (``tessera_jit``) gives tessera's NumPy scoring's numbers bit for bit.

Each test runs the same random cluster states and requests through three ``TesseraPolicy`` objects that differ only
in how they score: the NumPy code (``use_kernels(None)``), the compiled loops, and the same loops uncompiled (the
module's plain Python functions, which is also what line coverage sees of them).
"""

import dataclasses
from typing import Any

import numpy as np
import pytest
from placement_cases import random_requests, random_state

from tessera.core.cluster import ClusterState
from tessera.core.fragmentation import typical_pods
from tessera.core.placement import tessera_jit
from tessera.core.placement.tessera import TesseraParams, TesseraPolicy
from tessera.core.workload import Request
from tessera.sim.placement_study.inputs import default_inputs

COMPILED = tessera_jit.compiled()
UNCOMPILED = tessera_jit.uncompiled()


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
        random_state(state, rng)
        for request in random_requests(rng, state.model_names, 10):
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
        random_state(state, rng)
        state.gpu_free_milli[:] = np.where(rng.random(state.gpu_free_milli.shape) < 0.7, 1000, state.gpu_free_milli)
        state.gpu_free_milli[~state.gpu_exists] = 0
        for request in random_requests(rng, state.model_names, 10):
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
        random_state(state, rng)
        for request in random_requests(rng, state.model_names, 10):
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


def test_a_large_batch_measures_each_distinct_state_once_with_the_same_numbers() -> None:
    """From 64 rows on the loops look each state up in a hash table (many idle nodes are alike)."""
    inputs = default_inputs()
    state = ClusterState(inputs.nodes)
    rng = np.random.default_rng(24)
    policies = _policies(state)
    for busy in (False, True):
        if busy:  # half the nodes in random states, the others idle
            idle = state.gpu_free_milli.copy()
            random_state(state, rng)
            keep = rng.random(state.num_nodes) < 0.5
            state.gpu_free_milli[keep] = idle[keep]
        for request in (
            Request(num_gpus=1, gpu_milli=300, cpu_milli=4000),
            Request(num_gpus=2, gpu_milli=1000, cpu_milli=8000),
        ):
            need = state.milli_by_model(request)[state.model_idx]
            every = np.arange(state.num_nodes)
            feasible = every[state.feasible(request, every, need)]
            assert feasible.size >= 64
            got = {
                name: policy.score_nodes(state, request, feasible, need[feasible]).score.tolist()
                for name, policy in policies.items()
            }
            assert got["compiled"] == got["numpy"] == got["python"]


def _tied_scores(rng: np.random.Generator, bits: np.ndarray, step: float) -> np.ndarray:
    """Four levels ``step`` apart; the nodes that lose no shape far below (so the best ones all pay a charge)."""
    levels = rng.integers(0, 4, bits.size) * step
    return np.asarray(levels - np.where(bits == 0, 10 * step, 0.0), dtype=np.float64)


def test_choosing_the_nodes_to_charge_in_loops_gives_adjust_best_bits_scores() -> None:
    """Many tied scores, charges of the same order: the best ties, then the nodes that reach the best charged."""
    inputs = default_inputs()
    rng = np.random.default_rng(25)
    state = ClusterState(inputs.nodes)
    policy = _policies(state)["python"]
    reserve = policy.reserve
    small = Request(num_gpus=1, gpu_milli=1000, cpu_milli=8_000, mem_mib=16_384)
    nodes = np.arange(state.num_nodes)
    bits = reserve.lost_bits(state, small, nodes, 1)
    assert bits is not None and bits.any()
    known = np.full(state.num_nodes, reserve.shapes, dtype=np.int64)
    step = float(reserve.charge_bits(state, bits[bits != 0]).min()) / 2  # every charge spans a step or more
    charged = rest = 0
    for _ in range(60):
        score = _tied_scores(rng, bits, step)
        want = reserve.adjust_best_bits(state, lambda which: bits[nodes[which]], score)
        got = policy._adjust_compiled(UNCOMPILED, state, score, nodes, bits, known, lambda which: bits[nodes[which]])
        assert want is not None and got.tolist() == want.tolist()
        charged += int((got < score).any())
        rest += int(((got < score) & (score < score.max())).any())
    assert charged and rest  # the top was charged, and so were nodes below it
    # Bits kept before the reserve's last shape are completed through lost_of, for the top and for the rest.
    for top_behind in (True, False):
        score = _tied_scores(rng, bits, step)
        late = np.flatnonzero(score == score.max())[:1] if top_behind else np.flatnonzero(score < score.max())
        behind = known.copy()
        behind[nodes[late]] -= 1
        completed: list[int] = []

        def complete(which: np.ndarray, behind: np.ndarray = behind, completed: list[int] = completed) -> np.ndarray:
            completed.extend(int(i) for i in which if behind[nodes[i]] != known[nodes[i]])
            behind[nodes[which]] = known[nodes[which]]
            return np.asarray(bits[nodes[which]])

        want = reserve.adjust_best_bits(state, lambda which: bits[nodes[which]], score)
        got = policy._adjust_compiled(UNCOMPILED, state, score, nodes, bits, behind, complete)
        assert want is not None and got.tolist() == want.tolist()
        assert completed


def test_without_a_place_for_numbas_cache_the_kernels_compile_without_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """A read-only install run by a user whose cache directory is read-only too: numba refuses ``cache=True``
    (RuntimeError: no locator available); ``tessera up`` must still start, so the kernels compile uncached."""
    import numba

    real: Any = numba.njit
    asked: list[bool] = []

    def njit(*args: Any, cache: bool = False, **kwargs: Any) -> Any:
        asked.append(cache)
        if cache:
            raise RuntimeError("cannot cache function 'measure_rows': no locator available for file 'x.py'")
        return real(*args, cache=cache, **kwargs)

    monkeypatch.setattr(numba, "njit", njit)
    kernels = tessera_jit.compiled.__wrapped__()
    assert kernels is not None and asked[0] is True and asked[-1] is False
