"""Properties of the serving twin over small random workloads, for every policy: no request lost or served twice,
no replica beyond its GPU's memory, no KV block over-allocated, no lower SLO class served ahead of a higher one, and
drops only of the kinds the policies allow.

``CheckedTwin`` replays like the twin and watches it through its seams: an ``Outcomes`` that remembers every
completion and drop, a ``Fleet`` that checks the GPUs' books after every replica it adds, an ``Engine`` that records
when and where each request was submitted, and the control tick, where every engine's KV books are checked.
Engines run on ``conftest``'s cheap affine timings.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tessera.core.cluster import NodeSpec
from tessera.core.workload import MILLI_PER_GPU
from tessera.serving.models import CATALOG, ModelSpec
from tessera.serving.policies.engine import Engine
from tessera.serving.policies.engine_parts import Completion, EngineConfig, IterationTimes
from tessera.serving.policies.model_cache import Tier, ready_time_s
from tessera.serving.policies.requests import DEFAULT_SLO_TARGETS, InferenceRequest, SloClass, SloTarget
from tessera.serving.setups import SETUP_NAMES, PolicySetup, serving_setup
from tessera.sim.serving.fleet import Fleet, Replica
from tessera.sim.serving.outcomes import Outcomes
from tessera.sim.serving.result import PolicyRun
from tessera.sim.serving.twin import PerfFactory, Twin, TwinInputs

GPUS_PER_NODE = 8
GPU = "H100-80GB"


# ------------------------------------------------------------------------------------------------ the harness
class Ledger(Outcomes):
    """Outcomes that also remember each completion, and each drop with its reason and time."""

    def __init__(self, models: list[str], targets: dict[SloClass, SloTarget], clock: Callable[[], float]) -> None:
        super().__init__(models, targets)
        self.clock = clock
        self.completions: list[Completion] = []
        self.drops: list[tuple[InferenceRequest, str, float]] = []

    def served(self, c: Completion) -> None:
        if not c.refused:
            self.completions.append(c)
        super().served(c)  # a refused completion comes back through dropped()

    def dropped(self, request: InferenceRequest, reason: str) -> None:
        self.drops.append((request, reason, self.clock()))
        super().dropped(request, reason)


class RecordingEngine(Engine):
    """An engine that reports every request submitted to it (replica id, request, time)."""

    def __init__(
        self,
        config: EngineConfig,
        times: IterationTimes,
        replica: int,
        on_submit: Callable[[int, InferenceRequest, float], None],
    ) -> None:
        super().__init__(config, times)
        self.replica = replica
        self.on_submit = on_submit

    def submit(self, request: InferenceRequest, now_s: float) -> list[Completion]:
        self.on_submit(self.replica, request, now_s)
        return super().submit(request, now_s)


def memory_violations(fleet: Fleet) -> list[str]:
    """Each GPU: the memory its replicas' placements ask for fits its memory, the core's milli books add up to
    what the placements took, and no free capacity is negative."""
    state = fleet.state
    found: list[str] = []
    for name, free in (("gpu milli", state.gpu_free_milli), ("cpu", state.cpu_free_milli), ("mem", state.mem_free_mib)):
        if (free < 0).any():
            found.append(f"negative free {name}: {free.tolist()}")
    asked_mib: dict[tuple[int, int], int] = defaultdict(int)
    taken_milli: dict[tuple[int, int], int] = defaultdict(int)
    for replica in fleet.replicas.values():
        for p in replica.placements:
            gpu_mib = int(state.model_mem_mib[state.model_idx[p.node]])
            per_gpu = p.request.gpu_mem_mib or gpu_mib * p.gpu_milli_each // MILLI_PER_GPU
            for g in p.gpu_indices:
                asked_mib[(p.node, g)] += per_gpu
                taken_milli[(p.node, g)] += p.gpu_milli_each
    for (node, g), mib in asked_mib.items():
        capacity = int(state.model_mem_mib[state.model_idx[node]])
        if mib > capacity:
            found.append(f"GPU {node}/{g}: replicas ask for {mib} MiB of {capacity}")
    for node in range(state.num_nodes):
        for g in range(int(state.gpu_count[node])):
            used = int(state.gpu_cap_milli[node, g] - state.gpu_free_milli[node, g])
            if used != taken_milli.get((node, g), 0):
                found.append(f"GPU {node}/{g}: the core counts {used} milli taken, placements {taken_milli[(node, g)]}")
    return found


class CheckedFleet(Fleet):
    def __init__(
        self,
        nodes: Sequence[NodeSpec],
        setup: PolicySetup,
        seed: int,
        horizon_s: float,
        on_add: Callable[[Replica], None],
    ) -> None:
        super().__init__(nodes, setup.placement, seed, setup.sharing, horizon_s)
        self.on_add = on_add
        self.memory_checks = 0
        self.memory_violations: list[str] = []

    def add(self, replica: Replica, now_s: float) -> None:
        super().add(replica, now_s)
        self.on_add(replica)
        self.memory_checks += 1
        self.memory_violations += memory_violations(self)


class CheckedTwin(Twin):
    """The twin, watched (see the module docstring); violations are collected, not raised, for each test to read."""

    def __init__(self, inputs: TwinInputs, setup: PolicySetup, seed: int = 0) -> None:
        super().__init__(inputs, setup, seed)
        self.ledger = Ledger(list(self.models), inputs.targets, lambda: self.now)
        self.outcomes = self.ledger
        self.checked_fleet = CheckedFleet(inputs.nodes, setup, seed, inputs.duration_s, self._instrument)
        self.fleet = self.checked_fleet
        self.submits: dict[int, tuple[int, float]] = {}  # request id -> (replica, time) it was submitted
        self.submitted_twice: list[int] = []
        self.order_violations: list[str] = []
        self.kv_checks = 0
        self.kv_violations: list[str] = []
        self.result: PolicyRun | None = None

    def _instrument(self, replica: Replica) -> None:
        engine = replica.engine
        assert engine.idle and engine.iterations == 0, "a replica is added with a fresh engine"
        replica.engine = RecordingEngine(engine.config, engine.times, replica.id, self._on_submit)

    def _on_submit(self, replica: int, request: InferenceRequest, now_s: float) -> None:
        if request.id in self.submits:
            self.submitted_twice.append(request.id)
        self.submits[request.id] = (replica, now_s)
        head = self.models[request.model].gateway.peek()
        if head is not None and head.slo < request.slo:
            self.order_violations.append(
                f"t={now_s:.3f}: {request.slo.label} request {request.id} sent to an engine while "
                f"{head.slo.label} request {head.id} waits at the gateway"
            )

    def _tick(self, now: float) -> None:
        super()._tick(now)
        self.check_kv()

    def check_kv(self) -> None:
        for r in self.fleet.replicas.values():
            e = r.engine
            held = sum(s.blocks for s in e.running)
            self.kv_checks += 1
            if e.free_blocks < 0 or held + e.free_blocks != e.config.kv_blocks or any(s.blocks for s in e.waiting):
                self.kv_violations.append(
                    f"t={self.now:.3f} replica {r.id}: {held} blocks held + {e.free_blocks} free"
                    f" != {e.config.kv_blocks}"
                )


def engine_order_violations(twin: CheckedTwin) -> list[str]:
    """Requests that entered a running batch while a request of a more urgent class waited in the same engine
    (between its submission and its first admission)."""
    waits: dict[int, list[tuple[float, float, SloClass, int]]] = defaultdict(list)
    for c in twin.ledger.completions:
        replica, submitted = twin.submits[c.request.id]
        waits[replica].append((submitted, c.admitted_s[0], c.request.slo, c.request.id))
    found = []
    for c in twin.ledger.completions:
        replica, _ = twin.submits[c.request.id]
        for t in c.admitted_s:
            for submitted, admitted, slo, rid in waits[replica]:
                if slo < c.request.slo and submitted < t < admitted:
                    found.append(f"{c.request.slo.label} {c.request.id} admitted at {t:.3f}; {slo.label} {rid} waits")
    return found


# -------------------------------------------------------------------------------------------------- workloads
def request(
    i: int, model: str, arrival: float, prompt: int, output: int, slo: SloClass = SloClass.INTERACTIVE
) -> InferenceRequest:
    return InferenceRequest(i, model, arrival, prompt, output, slo, arrival + DEFAULT_SLO_TARGETS[slo].ttft_s)


def nodes(count: int, gpus: int = GPUS_PER_NODE) -> list[NodeSpec]:
    return [NodeSpec(f"node-{i}", 128_000, 2_048_000, gpus, GPU) for i in range(count)]


def renumbered(requests: list[InferenceRequest]) -> list[InferenceRequest]:
    """Sorted by arrival, with ids 0..n-1 in that order (as a workload's)."""
    ordered = sorted(requests, key=lambda r: (r.arrival_s, r.id))
    return [dataclasses.replace(r, id=i) for i, r in enumerate(ordered)]


# A 4 s interactive TTFT target leaves 2 s for a warm start: tessera may then scale a model to zero (and hold)
RELAXED = {**DEFAULT_SLO_TARGETS, SloClass.INTERACTIVE: SloTarget(ttft_s=4.0, tpot_s=0.2)}


@st.composite
def workloads(draw: st.DrawFn, perf: PerfFactory) -> TwinInputs:
    """1-3 catalog models (Zipf popularity), 20-300 requests over 5-300 s, part of them in one burst, lognormal
    lengths, a random SLO mix, sessions and prefixes, the default or ``RELAXED`` targets; on 1-3 nodes of 8 H100s,
    enough for static's replicas."""
    kinds = draw(st.lists(st.sampled_from(sorted(CATALOG)), min_size=1, max_size=3))
    count = draw(st.integers(20, 300))
    horizon = draw(st.floats(5.0, 300.0))
    targets = draw(st.sampled_from([DEFAULT_SLO_TARGETS, RELAXED]))
    burst = draw(st.floats(0.0, 1.0))  # the share of the requests that arrive in one burst of 5% of the horizon
    mix = np.array(draw(st.tuples(st.floats(0.0, 1.0), st.floats(0.0, 1.0), st.floats(0.05, 1.0))))
    replicas = draw(st.lists(st.integers(1, 2), min_size=len(kinds), max_size=len(kinds)))
    extra_nodes = draw(st.integers(0, 2))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))

    specs: dict[str, ModelSpec] = {f"m{i}-{kind}": CATALOG[kind] for i, kind in enumerate(kinds)}
    names = list(specs)
    shares = 1.0 / np.arange(1, len(names) + 1)
    owners = rng.choice(len(names), size=count, p=shares / shares.sum())
    in_burst = rng.random(count) < burst
    start = rng.uniform(0.0, 0.95 * horizon)
    arrivals = np.where(in_burst, start + rng.uniform(0.0, 0.05 * horizon, count), rng.uniform(0.0, horizon, count))
    prompts = np.clip(np.rint(rng.lognormal(math.log(600), 1.0, count)), 1, 4000).astype(int)
    outputs = np.clip(np.rint(rng.lognormal(math.log(80), 1.0, count)), 1, 1000).astype(int)
    classes = rng.choice(3, size=count, p=mix / mix.sum())
    sessions = rng.integers(0, 8, count)
    requests = []
    for i in range(count):
        r = request(i, names[owners[i]], float(arrivals[i]), int(prompts[i]), int(outputs[i]), SloClass(classes[i]))
        r.session = int(sessions[i])
        r.prefix = (int(owners[i]) + 1, 1000 + int(sessions[i]))[: int(prompts[i]) // 16]
        requests.append(r)
    fixed = dict(zip(names, replicas, strict=True))
    gpus = sum(specs[name].tensor_parallel * fixed[name] for name in names)
    count_nodes = min(3, math.ceil(gpus / GPUS_PER_NODE) + extra_nodes)
    return TwinInputs(
        renumbered(requests), specs, horizon, nodes(count_nodes), perf, fixed_replicas=fixed, targets=dict(targets)
    )


def replay(inputs: TwinInputs, policy: str | PolicySetup, seed: int = 0) -> CheckedTwin:
    twin = CheckedTwin(inputs, serving_setup(policy) if isinstance(policy, str) else policy, seed)
    twin.result = twin.run()
    twin.check_kv()
    return twin


PROPERTY = settings(max_examples=25)
policies = pytest.mark.parametrize("policy", SETUP_NAMES)


# ------------------------------------------------------------------------------------------------- properties
@policies
@PROPERTY
@given(data=st.data())
def test_every_request_is_served_or_dropped_exactly_once(policy: str, perf: PerfFactory, data: st.DataObject) -> None:
    inputs = data.draw(workloads(perf))
    twin = replay(inputs, policy)
    served = Counter(c.request.id for c in twin.ledger.completions)
    dropped = Counter(r.id for r, _, _ in twin.ledger.drops)
    assert not [i for i, n in served.items() if n > 1], "served twice"
    assert not [i for i, n in dropped.items() if n > 1], "dropped twice"
    assert not set(served) & set(dropped), "both served and dropped"
    assert set(served) | set(dropped) == {r.id for r in inputs.requests}, "lost"
    assert not twin.submitted_twice
    for stats in twin.ledger.stats.values():
        assert stats.requests == len(stats.ttft) + stats.dropped
    assert twin.result is not None
    assert (twin.result.requests, twin.result.dropped) == (len(inputs.requests), len(dropped))


@policies
@PROPERTY
@given(data=st.data())
def test_a_replica_is_never_placed_beyond_its_gpus_memory(policy: str, perf: PerfFactory, data: st.DataObject) -> None:
    twin = replay(data.draw(workloads(perf)), policy)
    assert twin.checked_fleet.memory_checks >= len(twin.models)
    assert twin.checked_fleet.memory_violations == []


@policies
@PROPERTY
@given(data=st.data())
def test_kv_blocks_are_never_over_allocated(policy: str, perf: PerfFactory, data: st.DataObject) -> None:
    twin = replay(data.draw(workloads(perf)), policy)
    assert twin.kv_checks > 0
    assert twin.kv_violations == []


# tessera's gateway keeps engine queues short, so its engines rarely choose between classes; without late binding
# every request goes straight to an engine and the engine's priority order does the work
EARLY_BINDING = dataclasses.replace(serving_setup("tessera"), name="tessera-early-binding", late_binding=False)


@pytest.mark.parametrize("setup", [serving_setup("tessera"), EARLY_BINDING], ids=lambda s: s.name)
@PROPERTY
@given(data=st.data())
def test_tessera_never_serves_a_lower_class_ahead_of_a_higher_one(
    setup: PolicySetup, perf: PerfFactory, data: st.DataObject
) -> None:
    """At the gateway (what it sends to an engine) and inside each engine (what enters the running batch)."""
    twin = replay(data.draw(workloads(perf)), setup)
    assert twin.order_violations == []
    assert engine_order_violations(twin) == []


@policies
@PROPERTY
@given(data=st.data())
def test_drops_are_only_batch_sheds_or_expired_holds(policy: str, perf: PerfFactory, data: st.DataObject) -> None:
    inputs = data.draw(workloads(perf))
    twin = replay(inputs, policy)
    for r, reason, _ in twin.ledger.drops:
        kind = reason.split(":")[0]
        assert kind in ("shed", "held"), reason
        assert kind != "shed" or r.slo is SloClass.BATCH, reason
        # under the default targets tessera keeps a replica of every model (no warm start fits the budget): it
        # never holds, so it drops nothing but shed batch
        if policy == "tessera" and inputs.targets == DEFAULT_SLO_TARGETS:
            assert r.slo is SloClass.BATCH, f"tessera dropped {r.slo.label} request: {reason}"


def test_the_checks_can_fail(perf: PerfFactory) -> None:
    """The harness sees corrupted books: a GPU share counted twice, a KV block lost."""
    inputs = TwinInputs([request(0, "m", 0.0, 100, 10)], {"m": CATALOG["llama3-8b"]}, 10.0, nodes(1), perf)
    twin = replay(inputs, "tessera")
    assert twin.checked_fleet.memory_violations == [] and twin.kv_violations == []
    (replica,) = twin.fleet.replicas.values()
    twin.fleet.state.gpu_free_milli[replica.placements[0].node, replica.placements[0].gpu_indices[0]] -= 1
    assert memory_violations(twin.fleet)
    replica.engine.free_blocks -= 1
    twin.check_kv()
    assert twin.kv_violations


# ------------------------------------------------------------------------------ SLO classes under a batch flood
def batch_flood(perf: PerfFactory) -> TwinInputs:
    """One 8B model on a one-GPU cluster: 1,500 long batch requests in the first 5 s (far more than it can serve
    within the batch TTFT target), then 200 short interactive ones spread over 10-60 s (a light load on its own)."""
    rng = np.random.default_rng(1)
    flood = [request(0, "m", float(t), 1000, 400, SloClass.BATCH) for t in rng.uniform(0.0, 5.0, 1500)]
    chat = [request(0, "m", float(t), 500, 50) for t in rng.uniform(10.0, 60.0, 200)]
    return TwinInputs(renumbered(flood + chat), {"m": CATALOG["llama3-8b"]}, 60.0, nodes(1, gpus=1), perf)


@pytest.fixture(scope="module")
def flooded(perf: PerfFactory) -> CheckedTwin:
    return replay(batch_flood(perf), "tessera")


def ttfts(twin: CheckedTwin, slo: SloClass) -> np.ndarray:
    return np.array([c.ttft_s for c in twin.ledger.completions if c.request.slo is slo])


def test_under_a_batch_flood_interactive_requests_go_far_ahead_of_batch(flooded: CheckedTwin) -> None:
    interactive, batch = ttfts(flooded, SloClass.INTERACTIVE), ttfts(flooded, SloClass.BATCH)
    assert interactive.size == 200, "every interactive request is served"
    assert not [r for r, _, _ in flooded.ledger.drops if r.slo is not SloClass.BATCH]
    assert np.percentile(interactive, 99) < np.percentile(batch, 99) / 10
    assert flooded.order_violations == []
    assert engine_order_violations(flooded) == []


def gateway_inversions(twin: CheckedTwin) -> list[str]:
    """Batch requests that entered a running batch while an interactive request of their model waited at the
    gateway (arrived, not yet sent to an engine)."""
    waiting = [(c.request.arrival_s, twin.submits[c.request.id][1], c.request) for c in twin.ledger.completions]
    found = []
    for c in twin.ledger.completions:
        if c.request.slo is not SloClass.BATCH:
            continue
        for t in c.admitted_s:
            for arrived, sent, r in waiting:
                if r.slo is SloClass.INTERACTIVE and r.model == c.request.model and arrived < t < sent:
                    found.append(f"batch {c.request.id} admitted at {t:.3f}; interactive {r.id} at the gateway")
    return found


def test_no_batch_request_enters_a_running_batch_while_an_interactive_one_waits_at_the_gateway(
    flooded: CheckedTwin,
) -> None:
    assert gateway_inversions(flooded) == []


def test_a_light_interactive_load_meets_its_ttft_target_next_to_a_batch_flood(flooded: CheckedTwin) -> None:
    target = DEFAULT_SLO_TARGETS[SloClass.INTERACTIVE].ttft_s
    assert np.percentile(ttfts(flooded, SloClass.INTERACTIVE), 99) <= target


def test_tessera_sheds_batch_under_a_batch_flood(flooded: CheckedTwin) -> None:
    shed = [r for r, reason, _ in flooded.ledger.drops if reason.startswith("shed")]
    assert shed and all(r.slo is SloClass.BATCH for r in shed)


# ------------------------------------------------------------------------------------- zero, holds, rejection
LATE = 5  # the id of idle_gap's last request


def idle_gap(perf: PerfFactory, kind: str, targets: dict[SloClass, SloTarget]) -> TwinInputs:
    """One model: five short requests in the first second, silence, then one more at 200 s."""
    requests = [request(i, "m", 0.2 * i, 200, 20) for i in range(LATE)] + [request(LATE, "m", 200.0, 200, 20)]
    return TwinInputs(requests, {"m": CATALOG[kind]}, 240.0, nodes(1), perf, targets=dict(targets))


def late_ttft(twin: CheckedTwin) -> float:
    (completion,) = [c for c in twin.ledger.completions if c.request.id == LATE]
    return completion.ttft_s


def gpus_in_use(twin: CheckedTwin, after_s: float = 0.0, before_s: float = math.inf) -> np.ndarray:
    """The GPUs in use at the samples in (after_s, before_s)."""
    assert twin.result is not None
    times = twin.result.times_s
    return twin.result.gpus_in_use[(times > after_s) & (times < before_s)]


@pytest.mark.parametrize("kind", ["llama3-8b", "llama2-70b"])
def test_tessera_keeps_a_replica_when_a_warm_start_misses_the_budget(perf: PerfFactory, kind: str) -> None:
    """The default interactive TTFT target (2 s) leaves 1 s for a warm start: neither model makes it."""
    spec = CATALOG[kind]
    assert ready_time_s(spec.weights_bytes, Tier.WARM, gpus=spec.tensor_parallel) > 1.0
    twin = replay(idle_gap(perf, kind, DEFAULT_SLO_TARGETS), "tessera")
    assert (gpus_in_use(twin) > 0).all()
    assert twin.cold_starts == 0
    assert late_ttft(twin) < 0.5  # served at once by the replica it kept


@pytest.mark.parametrize("kind", ["llama3-8b", "llama2-70b"])
def test_tessera_scales_to_zero_when_a_warm_start_fits_and_holds_until_it_is_back(perf: PerfFactory, kind: str) -> None:
    spec = CATALOG[kind]
    warm = ready_time_s(spec.weights_bytes, Tier.WARM, gpus=spec.tensor_parallel)
    assert warm <= RELAXED[SloClass.INTERACTIVE].ttft_s / 2
    twin = replay(idle_gap(perf, kind, RELAXED), "tessera")
    assert (gpus_in_use(twin, 70.0, 200.0) == 0).all()  # idle since 1 s: the 30 s grace is long over
    assert twin.cold_starts == 1 and twin.ledger.drops == []
    assert warm <= late_ttft(twin) <= warm + 0.5  # held while the replica wakes from host memory, then served


def test_static_autoscale_scales_to_zero_and_holds_through_a_cold_start(perf: PerfFactory) -> None:
    spec = CATALOG["llama3-8b"]
    cold = ready_time_s(spec.weights_bytes, Tier.COLD)
    twin = replay(idle_gap(perf, "llama3-8b", DEFAULT_SLO_TARGETS), "static-autoscale")
    assert (gpus_in_use(twin, 70.0, 200.0) == 0).all()
    assert twin.ledger.drops == []
    assert cold <= late_ttft(twin) <= cold + 0.5


@pytest.mark.parametrize(
    ("policy", "gpus", "targets"), [("static-autoscale", 2, DEFAULT_SLO_TARGETS), ("tessera", 1, RELAXED)]
)
def test_a_held_request_is_rejected_after_max_hold_when_no_replica_can_start(
    perf: PerfFactory, policy: str, gpus: int, targets: dict[SloClass, SloTarget]
) -> None:
    """Model a goes to zero after its first request; a flood of model b takes every GPU; a's second request, at
    100 s, is held, finds no room for a replica, and is refused once it has been held ``max_hold_s``."""
    rng = np.random.default_rng(2)
    flood = [request(0, "b", float(t), 1000, 1000) for t in rng.uniform(0.0, 300.0, 3000)]
    mine = [request(0, "a", 0.0, 100, 10), request(0, "a", 100.0, 100, 10)]
    specs = {"a": CATALOG["llama3-8b"], "b": CATALOG["llama2-13b"]}  # two replicas of b fill a GPU's memory
    inputs = TwinInputs(renumbered(mine + flood), specs, 300.0, nodes(1, gpus=gpus), perf, targets=dict(targets))
    twin = replay(inputs, policy)
    assert twin.start_failures > 0
    (refused,) = [(r, reason, t) for r, reason, t in twin.ledger.drops if r.model == "a"]
    request_a, reason, when = refused
    max_hold = serving_setup(policy).max_hold_s
    assert request_a.arrival_s == 100.0
    assert reason.startswith("held:") and "no ready replica" in reason and "'a'" in reason
    assert 100.0 + max_hold <= when <= 100.0 + max_hold + serving_setup(policy).tick_s
