"""The serving twin's GPU fleet, through whole replays: static holds whole GPUs for the whole horizon, tessera packs
small models onto shared GPUs, and a busy neighbour on a shared GPU slows a replica down (an idle one does not).

Engines run on ``conftest``'s affine timings, so the expected iteration times are known in closed form.
"""

from __future__ import annotations

import dataclasses

import pytest

from tessera.core.cluster import NodeSpec
from tessera.core.workload import MILLI_PER_GPU, Request
from tessera.serving.models import CATALOG, GIB, MIB, ModelSpec
from tessera.serving.policies.engine import Engine
from tessera.serving.policies.engine_parts import EngineConfig
from tessera.serving.policies.requests import DEFAULT_SLO_TARGETS, InferenceRequest, SloClass
from tessera.serving.setups import serving_setup
from tessera.serving.sizing import replica_shape
from tessera.sim.serving.fleet import Fleet, Replica
from tessera.sim.serving.interference import StepDemand
from tessera.sim.serving.result import PolicyRun
from tessera.sim.serving.twin import PerfFactory, Twin, TwinInputs

GPU = "H100-80GB"


def request(i: int, model: str, arrival: float, prompt: int, output: int) -> InferenceRequest:
    slo = SloClass.INTERACTIVE
    return InferenceRequest(i, model, arrival, prompt, output, slo, arrival + DEFAULT_SLO_TARGETS[slo].ttft_s)


def nodes(count: int, gpus: int = 8) -> list[NodeSpec]:
    return [NodeSpec(f"node-{i}", 128_000, 2_048_000, gpus, GPU) for i in range(count)]


def spread(models: list[str], per_model: int, horizon_s: float, output: int = 50) -> list[InferenceRequest]:
    """``per_model`` requests of each model, evenly spread over the horizon, in arrival order."""
    times = sorted(
        (horizon_s * k / per_model + 0.01 * j, name) for j, name in enumerate(models) for k in range(per_model)
    )
    return [request(i, name, t, 300, output) for i, (t, name) in enumerate(times)]


def model_outcome(run: PolicyRun, name: str) -> tuple[float, int]:
    """(TPOT p99, served) of one model of a run."""
    (outcome,) = [o for o in run.models if o.model == name]
    return outcome.tpot_p99_s, outcome.served


# ------------------------------------------------------------------------------------------------- static
def test_static_holds_its_whole_gpus_for_the_whole_horizon(perf: PerfFactory) -> None:
    specs = {"small": CATALOG["llama3-8b"], "mid": CATALOG["codellama-34b"], "large": CATALOG["llama2-70b"]}
    fixed = {"small": 2, "mid": 1, "large": 1}
    horizon = 600.0
    requests = spread(list(specs), 20, horizon - 20.0, output=1500)  # the last ones finish after the horizon
    twin = Twin(TwinInputs(requests, specs, horizon, nodes(2), perf, fixed_replicas=fixed), serving_setup("static"))
    run = twin.run()
    gpus = sum(fixed[name] * spec.tensor_parallel for name, spec in specs.items())
    assert run.gpu_hours == pytest.approx(gpus * horizon / 3600.0)
    assert (run.gpus_in_use == gpus).all() and run.peak_gpus == gpus
    assert run.cold_starts == 0  # preloaded before the first request
    assert run.dropped == 0 and run.requests == len(requests)
    held = [(p.node, g) for r in twin.fleet.replicas.values() for p in r.placements for g in p.gpu_indices]
    assert len(held) == len(set(held)) == gpus  # one replica per GPU...
    assert all(p.gpu_milli_each == MILLI_PER_GPU for r in twin.fleet.replicas.values() for p in r.placements)


# -------------------------------------------------------------------------------------------------- sharing
def test_tessera_packs_several_small_models_onto_one_gpu(perf: PerfFactory) -> None:
    specs = {f"m{i}": CATALOG["llama3-8b"] for i in range(4)}
    requests = spread(list(specs), 10, 300.0)
    inputs = TwinInputs(requests, specs, 300.0, nodes(1), perf)
    tessera = Twin(inputs, serving_setup("tessera")).run()
    static = Twin(inputs, serving_setup("static")).run()
    assert tessera.peak_gpus < len(specs) == static.peak_gpus
    assert tessera.gpu_hours < static.gpu_hours
    assert tessera.dropped == 0 and tessera.worst_model_slo_attainment_pct == 100.0


def two_models_one_request_each(perf: PerfFactory, gap_s: float, gpus: int) -> TwinInputs:
    """Models a and b (8B each), one long decode each, b's ``gap_s`` after a's."""
    specs: dict[str, ModelSpec] = {"a": CATALOG["llama3-8b"], "b": CATALOG["llama3-8b"]}
    requests = [request(0, "a", 0.0, 100, 400), request(1, "b", gap_s, 100, 400)]
    return TwinInputs(requests, specs, 200.0, nodes(1, gpus=gpus), perf)


@pytest.mark.parametrize("sharing", ["time-slice", "mps"])
def test_a_busy_neighbour_on_a_shared_gpu_slows_both_replicas(perf: PerfFactory, sharing: str) -> None:
    """Time-slicing: two busy replicas each run at half speed. MPS: two equal replicas are each slowed by the sum of
    their intensities (their saturating times added up, over one step; when over 1). An idle neighbour costs nothing
    either way."""
    setup = dataclasses.replace(serving_setup("tessera"), sharing=sharing)
    alone = Twin(two_models_one_request_each(perf, 100.0, gpus=1), setup)
    alone_run = alone.run()
    together = Twin(two_models_one_request_each(perf, 0.0, gpus=1), setup)
    together_run = together.run()
    assert alone_run.peak_gpus == together_run.peak_gpus == 1  # both replicas on the one GPU
    if sharing == "time-slice":
        expected = 2.0
    else:
        intensities = [r.demand.intensity for r in together.fleet.replicas.values()]
        assert len(intensities) == 2 and all(0.0 < u <= 1.0 for u in intensities)
        expected = max(1.0, sum(intensities))
        assert expected > 1.0, "two replicas decoding at their target batch saturate a GPU together"
    decode = perf(CATALOG["llama3-8b"], GPU, 1).iteration_s(0, 1, 300)  # one decode iteration, mean context
    for name in ("a", "b"):
        tpot_alone, served = model_outcome(alone_run, name)
        tpot_together, _ = model_outcome(together_run, name)
        assert served == 1
        assert tpot_alone == pytest.approx(decode, rel=0.05)  # an idle neighbour costs nothing
        assert tpot_together / tpot_alone == pytest.approx(expected, rel=0.05)


def test_replicas_on_separate_gpus_do_not_slow_each_other(perf: PerfFactory) -> None:
    alone = Twin(two_models_one_request_each(perf, 100.0, gpus=2), serving_setup("static")).run()
    together = Twin(two_models_one_request_each(perf, 0.0, gpus=2), serving_setup("static")).run()
    for name in ("a", "b"):
        assert model_outcome(together, name)[0] == pytest.approx(model_outcome(alone, name)[0])


def test_under_mps_a_light_neighbour_waits_for_a_busy_ones_saturating_time(perf: PerfFactory) -> None:
    """Measured on an H100 (docs/serving.md, section 9): beside a busy decode loop, a light one's step stretches to
    the two loops' saturating times added up, so the light replica slows more than the busy one. An even split by
    the summed intensity (the twin's earlier rule) had the total right but not this."""
    fleet = Fleet(nodes(1, gpus=1), sharing="mps")
    engine_perf = perf(CATALOG["llama3-8b"], GPU, 1)
    busy, light = (
        Replica(fleet.new_id(), name, Engine(EngineConfig(kv_blocks=1000), engine_perf), placed, 0.0, 0.0)
        for name, placed in (("busy", fleet.place(share(0.4))), ("light", fleet.place(share(0.4))))
        if placed is not None
    )
    busy.demand = StepDemand(step_s=7.19e-3, intensity=0.93)  # the measured pair: batch 48 beside batch 4
    light.demand = StepDemand(step_s=3.14e-3, intensity=0.84)
    for r in (busy, light):
        fleet.add(r, 0.0)
    fleet.set_busy(busy, True)
    assert fleet.slowdown(busy) == 1.0  # alone busy: its own saturating time fits in its step
    fleet.set_busy(light, True)
    together_s = 0.93 * 7.19e-3 + 0.84 * 3.14e-3
    assert fleet.slowdown(busy) == pytest.approx(together_s / 7.19e-3)  # 1.30; measured 1.32
    assert fleet.slowdown(light) == pytest.approx(together_s / 3.14e-3)  # 2.97; measured 2.96
    fleet.set_busy(busy, False)
    assert fleet.slowdown(light) == 1.0  # an idle neighbour costs nothing


# ------------------------------------------------------------------------------------ tensor-parallel gangs
def share(fraction: float) -> Request:
    return Request(num_gpus=1, gpu_mem_mib=int(81_559 * fraction), gpu_types=frozenset({GPU}))


def test_a_gang_of_small_shares_takes_distinct_gpus_and_leaves_the_rest_to_others() -> None:
    fleet = Fleet(nodes(1, gpus=4), sharing="mps")
    first = fleet.place(share(0.3), shards=4)
    second = fleet.place(share(0.3), shards=4)
    assert first is not None and second is not None
    for gang in (first, second):
        assert sorted(g for p in gang for g in p.gpu_indices) == [0, 1, 2, 3]  # one shard per GPU, never two
    free = fleet.state.gpu_free_milli[0].copy()
    assert (free > 0).all()  # the fillers that kept shards apart were given back
    assert fleet.place(share(0.3), shards=4) is not None  # a third gang still fits (0.9 of each GPU)...
    before = fleet.state.gpu_free_milli.copy()
    assert fleet.place(share(0.3), shards=2) is None  # ...and then no GPU has room for another shard
    assert (fleet.state.gpu_free_milli == before).all()  # nothing stays bound after a failed gang


def test_a_gang_needs_as_many_gpus_with_room_as_it_has_shards() -> None:
    fleet = Fleet(nodes(1, gpus=4), sharing="mps")
    assert fleet.place(share(0.8), shards=1) is not None  # one GPU mostly taken: three have room for 0.5
    before = fleet.state.gpu_free_milli.copy()
    assert fleet.place(share(0.5), shards=4) is None
    assert (fleet.state.gpu_free_milli == before).all()
    gang = fleet.place(share(0.5), shards=3)
    assert gang is not None and len({g for p in gang for g in p.gpu_indices}) == 3


def test_a_shared_tensor_parallel_replica_reserves_a_one_gpu_replicas_kv_per_gpu() -> None:
    sizing = serving_setup("tessera").sizing
    small = replica_shape(CATALOG["llama3-8b"], GPU, sizing)
    for name in ("codellama-34b", "llama2-70b"):
        spec = CATALOG[name]
        shape = replica_shape(spec, GPU, sizing)
        tp = spec.tensor_parallel
        assert shape.shared and shape.gpus == tp > 1
        per_gpu_tokens = min(sizing.kv_reserve_tokens, int(sizing.kv_reserve_max_gib * GIB // spec.kv_bytes_per_token))
        assert shape.kv_blocks * 16 == pytest.approx(tp * per_gpu_tokens, abs=16)
        shard = (spec.weights_bytes + tp * per_gpu_tokens * spec.kv_bytes_per_token) / tp + sizing.overhead_gib * GIB
        assert shape.request.gpu_mem_mib == pytest.approx(shard / MIB, abs=1)  # no more than it needs
    assert small.kv_blocks * 16 == sizing.kv_reserve_tokens  # a one-GPU replica: the reserve itself


def test_isolated_replicas_never_slow_each_other() -> None:
    """``isolated`` (MIG slices; sim engines on simulated GPUs): however many are busy on one GPU, no stretch."""
    from tessera.sim.serving.interference import slowdown

    assert slowdown("isolated", 4, 10.0, 0.01) == 1.0
    assert slowdown("time-slice", 4, 10.0, 0.01) == 4.0 and slowdown("mps", 2, 0.03, 0.01) == 3.0


def test_without_shared_gangs_a_tensor_parallel_replica_takes_whole_gpus_and_a_small_one_still_shares() -> None:
    import dataclasses as dc

    sizing = dc.replace(serving_setup("tessera").sizing, shared_gangs=False)
    big = replica_shape(CATALOG["llama2-70b"], GPU, sizing)
    small = replica_shape(CATALOG["llama3-8b"], GPU, sizing)
    assert (big.shared, big.request.gpu_milli, big.request.num_gpus) == (False, MILLI_PER_GPU, 4)
    assert small.shared and small.request.gpu_mem_mib > 0
