"""The serving twin: one policy replaying one request trace on a simulated GPU cluster, in virtual time.

Events, earliest first: request arrivals (from the sorted trace), engine segment ends (``Engine.next_event_s``),
replicas becoming ready (weights loaded), and the control loop's tick (autoscaling, held requests, samples).

An arrival is admitted (or, ``batch`` only, shed), then routed to a ready replica of its model by the policy's
router, or held while a replica starts (scale from zero); held requests are never dropped before ``max_hold_s``.
Every engine call returns what completed, which is recorded; when a replica turns busy or idle the replicas that
share its GPUs get a new slowdown (``fleet``). A draining replica leaves when its engine is idle; under a model
cache its weights stay warm in the node's host memory.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from tessera.core.cluster import NodeSpec
from tessera.serving.models import ModelSpec
from tessera.serving.policies.admission import (
    AdmissionConfig,
    AdmissionSignals,
    HoldQueue,
    Shed,
    admit,
    expire,
    held_count,
    hold,
    release,
)
from tessera.serving.policies.engine import Engine
from tessera.serving.policies.engine_parts import Completion, EngineConfig, IterationTimes
from tessera.serving.policies.model_cache import (
    NodeCacheState,
    Tier,
    admit_warm,
    ready_time_s,
    tier_of,
)
from tessera.serving.policies.requests import DEFAULT_SLO_TARGETS, InferenceRequest, SloClass, SloTarget
from tessera.serving.policies.router import ReplicaView
from tessera.serving.setups import PolicySetup
from tessera.serving.sizing import concurrency_target, replica_shapes
from tessera.sim.serving.fleet import Fleet, Replica, ReplicaState, has_room
from tessera.sim.serving.interference import step_demand
from tessera.sim.serving.outcomes import Outcomes
from tessera.sim.serving.result import PolicyRun
from tessera.sim.serving.runtime import ModelRuntime
from tessera.sim.serving.scaling import Scaler

PerfFactory = Callable[[ModelSpec, str, int], IterationTimes]
_ENGINE, _READY, _TICK = 0, 1, 2
PREDICTED_OUTPUT_TOKENS = 256  # what the gateway assumes of an answer's length (the engines' load estimate too)
LOAD_WINDOW_S = 60.0  # the averaging window of a model's load, for choosing its replica size
GIB = 1024**3


@dataclass(frozen=True)
class TwinInputs:
    requests: list[InferenceRequest]  # sorted by arrival
    models: dict[str, ModelSpec]  # served model name -> its architecture
    duration_s: float  # the horizon GPU-hours are counted over
    nodes: list[NodeSpec]
    perf: PerfFactory  # engine timing of (model, GPU model, tensor parallel)
    fixed_replicas: dict[str, int] = field(default_factory=dict)  # static: replicas per model
    targets: dict[SloClass, SloTarget] = field(default_factory=lambda: dict(DEFAULT_SLO_TARGETS))
    sample_s: float = 10.0


class ProvisioningError(ValueError):
    """The cluster cannot hold the replicas that are up when the trace starts."""


class Twin:
    def __init__(self, inputs: TwinInputs, setup: PolicySetup, seed: int = 0) -> None:
        self.inputs = inputs
        self.setup = setup
        self.seed = seed
        self.rng = np.random.default_rng(seed)
        self.fleet = Fleet(inputs.nodes, setup.placement, seed, setup.sharing, inputs.duration_s)
        gpu_model = next(n.gpu_model for n in inputs.nodes if n.gpu_model)
        assert gpu_model is not None
        self.models: dict[str, ModelRuntime] = {}
        for name, spec in inputs.models.items():
            shapes = replica_shapes(spec, gpu_model, setup.sizing)
            perf = inputs.perf(spec, gpu_model, shapes[0].gpus)
            per_seq = setup.sizing.tokens_per_sequence
            batches = [round(concurrency_target(shape, setup.sizing)) for shape in shapes]
            demands = tuple(step_demand(spec, gpu_model, shapes[0].gpus, perf, b, b * per_seq) for b in batches)
            self.models[name] = ModelRuntime(name, spec, shapes, demands, perf, setup.router)
        self.outcomes = Outcomes(list(self.models), inputs.targets)
        self.scaler = Scaler(setup, inputs.targets) if setup.autoscaler else None
        self.admission = AdmissionConfig() if setup.admission else None
        self.hold = HoldQueue(max_hold_s=setup.max_hold_s)
        self.caches = [NodeCacheState(int(setup.host_cache_gib * GIB)) for _ in inputs.nodes]
        if setup.model_cache:
            self._prewarm()
        self.busy: set[int] = set()
        # every routing decision (the request, the replicas offered, the one chosen), when a caller asks for them
        # (the comparison with the live gateway's router)
        self.route_log: list[tuple[InferenceRequest, tuple[ReplicaView, ...], int | None]] | None = None
        self.heap: list[tuple[float, int, int, object]] = []
        self._seq = 0
        self.cold_starts = 0
        self.start_failures = 0
        self.samples: list[tuple[float, int, int]] = []  # (time, GPUs in use, arrivals in the interval)
        self._arrivals_in_sample = 0
        self.now = 0.0

    def _prewarm(self) -> None:
        """The trace is a window of a running service: every node starts with the served models in host memory,
        most popular first (``inputs.models`` is in popularity order), as many as its host cache holds."""
        for cache in self.caches:
            for name, spec in self.inputs.models.items():
                if cache.used_bytes + spec.weights_bytes <= cache.host_capacity_bytes:
                    admit_warm(cache, name, spec.weights_bytes, 0, 0.0)

    # ---------------------------------------------------------------------------------------------- the loop
    def run(self, progress: Callable[[float], None] | None = None) -> PolicyRun:
        """Replay the whole trace; ``progress(fraction of arrivals done)`` now and then."""
        wall = time.perf_counter()
        every = max(1, len(self.inputs.requests) // 50)
        self._provision()
        requests = self.inputs.requests
        n, i = len(requests), 0
        self._push(0.0, _TICK, None)
        next_sample = 0.0
        while True:
            t_arrival = requests[i].arrival_s if i < n else math.inf
            t_event = self.heap[0][0] if self.heap else math.inf
            if t_arrival == math.inf and t_event == math.inf:
                break
            if t_arrival <= t_event:
                self.now = t_arrival
                self._arrive(requests[i])
                i += 1
                if progress is not None and i % every == 0:
                    progress(i / n)
                continue
            t, _, kind, obj = heapq.heappop(self.heap)
            self.now = t
            if kind == _ENGINE:
                assert isinstance(obj, Replica)
                if obj.event_s == t and obj.id in self.fleet.replicas:
                    obj.event_s = math.inf
                    self._settle(obj, obj.engine.advance(t))
            elif kind == _READY:
                assert isinstance(obj, Replica)
                if obj.id in self.fleet.replicas and obj.state is ReplicaState.LOADING:
                    self._ready(obj)
            else:
                if t >= next_sample:
                    self._sample(t)
                    next_sample = t + self.inputs.sample_s
                self._tick(t)
                if i < n or self._work_left():
                    self._push(t + self.setup.tick_s, _TICK, None)
        self.fleet.account(self.inputs.duration_s)
        if progress is not None:
            progress(1.0)
        return self._result(time.perf_counter() - wall)

    def _push(self, t: float, kind: int, obj: object) -> None:
        self._seq += 1
        heapq.heappush(self.heap, (t, self._seq, kind, obj))

    def _work_left(self) -> bool:
        return (
            bool(self.busy)
            or self.hold.count > 0
            or any(len(m.gateway) for m in self.models.values())
            or any(r.state is ReplicaState.LOADING for r in self.fleet.replicas.values())
        )

    # ------------------------------------------------------------------------------------------------ requests
    def _arrive(self, request: InferenceRequest) -> None:
        m = self.models[request.model]
        m.observe(request.prompt_tokens, PREDICTED_OUTPUT_TOKENS)
        self.outcomes.arrived(request)
        m.arrivals += 1
        m.last_arrival_s = request.arrival_s
        self._arrivals_in_sample += 1
        ready = m.ready()
        if self.admission is not None and request.slo is SloClass.BATCH:
            queued = held_count(self.hold, m.name) + len(m.gateway) + sum(r.engine.load().queued for r in ready)
            verdict = admit(request, AdmissionSignals(len(ready), queued, 0.0), self.admission)
            if isinstance(verdict, Shed):
                self.outcomes.dropped(request, f"shed: {verdict.reason}")
                return
        if ready:
            self._dispatch(m, request)
            return
        self.hold = hold(self.hold, request, self.now)
        if self.scaler is not None and not m.active():
            self._scale(m)  # scale from zero now, not at the next tick

    def _dispatch(self, m: ModelRuntime, request: InferenceRequest) -> None:
        """Send ``request`` to a replica now, or (late binding) queue it at the gateway until one has room."""
        if not self.setup.late_binding:
            self._route(m, request, m.ready())
            return
        m.gateway.push(request)
        self._drain_gateway(m)

    def _drain_gateway(self, m: ModelRuntime) -> None:
        """Late binding: dispatch the gateway's requests, most urgent first, while some replica has room (nothing
        waiting inside its engine and some KV cache free), so no request waits behind one busy engine while
        another one, maybe just started, is idle."""
        while len(m.gateway):
            head = m.gateway.peek()
            assert head is not None
            room = [r for r in m.ready() if has_room(r, head)]
            if not room:
                return
            m.gateway.pop()
            self._route(m, head, room)

    def _route(self, m: ModelRuntime, request: InferenceRequest, candidates: list[Replica]) -> None:
        views = []
        for r in candidates:
            load = r.engine.load()
            views.append(
                ReplicaView(
                    r.id,
                    load.queued,
                    load.running,
                    load.predicted_tokens,
                    load.kv_free_frac,
                    prefill_tokens=load.prefill_tokens,
                )
            )
        decision, m.router_state = m.router.route(request, views, m.router_state, self.now, self.rng)
        if self.route_log is not None:
            self.route_log.append((request, tuple(views), decision.replica))
        replica = self.fleet.replicas[decision.replica] if decision.replica is not None else candidates[0]
        self._settle(replica, replica.engine.submit(request, self.now))

    def _settle(self, replica: Replica, completions: list[Completion]) -> None:
        """Record what completed, and propagate a busy/idle change to the replicas sharing its GPUs."""
        work = [(replica, completions)]
        while work:
            r, done = work.pop()
            for c in done:
                self.outcomes.served(c)
            if self.setup.late_binding and len(self.models[r.model].gateway):
                self._drain_gateway(self.models[r.model])
            busy = not r.engine.idle
            if busy != (r.id in self.busy):
                (self.busy.add if busy else self.busy.discard)(r.id)
                self.fleet.set_busy(r, busy)
                for other in [r, *self.fleet.neighbours(r)]:
                    if other.id in self.busy:
                        work.append((other, other.engine.set_slowdown(self.fleet.slowdown(other), self.now)))
            self._reschedule(r)
            if r.state is ReplicaState.DRAINING and r.engine.idle and r.id in self.fleet.replicas:
                self._retire(r)

    def _reschedule(self, replica: Replica) -> None:
        t = replica.engine.next_event_s
        if t != replica.event_s:
            replica.event_s = t
            if t < math.inf:
                self._push(t, _ENGINE, replica)

    # ------------------------------------------------------------------------------------------------ replicas
    def _provision(self) -> None:
        """The replicas that are up when the trace starts: static's fixed counts, else one per model."""
        # The largest replicas first, so that the smaller ones fill the gaps they leave.
        for m in sorted(self.models.values(), key=lambda m: (-m.shape.gpus, -m.shape.request.gpu_mem_mib, m.name)):
            count = self.inputs.fixed_replicas.get(m.name, 1) if self.scaler is None else 1
            for _ in range(count):
                replica = self._start(m, preloaded=True)
                if replica is None:
                    raise ProvisioningError(
                        f"{self.setup.name}: the cluster ({self.fleet.total_gpus} GPUs) cannot hold the initial "
                        f"replicas; give more GPUs"
                    )

    def _start(self, m: ModelRuntime, preloaded: bool = False) -> Replica | None:
        shards = m.shape.gpus if m.shape.shared else 1
        placements = self.fleet.place(m.shape.request, shards)
        if placements is None:
            self.start_failures += 1
            return None
        cache = self.caches[placements[0].node]
        tier = Tier.WARM if self.setup.model_cache and tier_of(cache, m.name) is Tier.WARM else Tier.COLD
        delay = 0.0 if preloaded else ready_time_s(m.spec.weights_bytes, tier, gpus=m.shape.gpus)
        config = EngineConfig(kv_blocks=m.shape.kv_blocks, priority=self.setup.engine_priority)
        replica = Replica(self.fleet.new_id(), m.name, Engine(config, m.perf), placements, self.now + delay, self.now)
        replica.size = m.size
        replica.demand = m.demand
        self.fleet.add(replica, self.now)
        m.replicas.append(replica)
        if preloaded:
            self._ready(replica)
        else:
            self.cold_starts += 1
            self._push(replica.ready_s, _READY, replica)
        return replica

    def _ready(self, replica: Replica) -> None:
        replica.state = ReplicaState.READY
        held, self.hold = release(self.hold, replica.model)
        m = self.models[replica.model]
        for request in held:
            self._dispatch(m, request)
        self._drain_gateway(m)

    def _drain(self, replica: Replica) -> None:
        if replica.state is ReplicaState.LOADING or replica.engine.idle:
            self._retire(replica)
        else:
            replica.state = ReplicaState.DRAINING

    def _retire(self, replica: Replica) -> None:
        m = self.models[replica.model]
        if replica.id in self.busy:
            self.busy.discard(replica.id)
            self.fleet.set_busy(replica, False)
        self.fleet.remove(replica, self.now)
        m.replicas.remove(replica)
        if self.setup.model_cache:
            admit_warm(self.caches[replica.node], m.name, m.spec.weights_bytes, 0, self.now)

    # --------------------------------------------------------------------------------------------- control loop
    def _tick(self, now: float) -> None:
        rejected, self.hold = expire(self.hold, now)
        for request, reason in rejected:
            self.outcomes.dropped(request, f"held: {reason}")
        alpha = min(1.0, self.setup.tick_s / LOAD_WINDOW_S)
        for m in self.models.values():
            ready = m.ready()
            in_flight = sum(r.engine.in_flight() for r in ready) + len(m.gateway) + held_count(self.hold, m.name)
            m.load_ema += alpha * (in_flight - m.load_ema)
            busy = sum(r.id in self.busy for r in ready) / len(ready) if ready else 0.0
            m.busy_ema += alpha * (busy - m.busy_ema)
            if self.scaler is not None:
                self._scale(m)
            m.arrivals = 0

    def _scale(self, m: ModelRuntime) -> None:
        """Reconcile ``m``'s replicas with its autoscaler: replicas of the size new ones get are counted; those of
        another size (the model's load crossed a size threshold) leave once their replacements serve."""
        assert self.scaler is not None
        active = m.active()
        m.choose_size(self.setup.sizing, self.now)
        current = [r for r in active if r.size == m.size]
        ttft, tpot = self.outcomes.latency.recent(m.name, self.now)
        desired = self.scaler.desired(m, current, active, self.hold, self.now, ttft, tpot)
        for _ in range(desired - len(current)):
            if self._start(m) is None:
                if m.size > 0:  # no room for a whole-GPU replica: small ones for a while, counted afresh
                    m.large_blocked_until_s = self.now + LOAD_WINDOW_S
                    m.size = 0
                    self._scale(m)
                    return
                break
        if len(current) > desired:
            # Loading replicas first, then those whose leaving frees whole GPUs (consolidation), then the idlest.
            order = sorted(
                current,
                key=lambda r: (
                    r.state is ReplicaState.READY,
                    -self.fleet.gpus_freed_by(r),
                    r.engine.in_flight(),
                    -r.id,
                ),
            )
            for replica in order[: len(current) - desired]:
                self._drain(replica)
        replaced = sum(r.state is ReplicaState.READY for r in current) >= desired
        if replaced and len(active) > len(current):
            for replica in active:
                if replica.size != m.size:
                    self._drain(replica)

    def _sample(self, now: float) -> None:
        self.samples.append((now, self.fleet.gpus_in_use, self._arrivals_in_sample))
        self._arrivals_in_sample = 0

    def _result(self, wall_s: float) -> PolicyRun:
        return self.outcomes.policy_run(
            self.setup.name,
            self.seed,
            self.fleet,
            self.cold_starts,
            np.asarray(self.samples, dtype=np.float64).reshape(-1, 3),
            self.inputs.sample_s,
            wall_s,
        )
