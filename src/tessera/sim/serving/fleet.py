"""The serving twin's GPU fleet: model replicas placed by the core placement engine, the GPUs they share, the
slowdown that sharing costs, and the GPU-hours they hold.

A replica is an ordinary core ``Request``: a share of one GPU sized by memory (weights plus a KV-cache reserve) for
a model that fits on one GPU, or whole GPUs for a tensor-parallel one. ``Placer.decide`` picks the node and GPUs
exactly as it does for any other workload, so several small models pack onto one GPU.

**Sharing a GPU.** Replicas on one GPU share its compute and memory bandwidth. The fleet tracks the *busy*
replicas (engine not idle) on each GPU and stretches each busy replica's iterations as ``interference`` says for
the sharing mode (time-slicing: by the number of busy replicas; MPS: to at least their saturating times added up).
An idle neighbour costs nothing.

**GPU-hours.** A GPU counts as in use while at least one replica (loading, ready or draining) holds a share of it.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from tessera.core.cluster import ClusterState, NodeSpec
from tessera.core.placement import Placer, make_policy
from tessera.core.placement.gang import one_node_candidates
from tessera.core.workload import Placement, Request
from tessera.serving.policies.engine import Engine
from tessera.serving.policies.requests import InferenceRequest
from tessera.serving.setups import ROOM_KV_FREE
from tessera.sim.serving.interference import SHARING_MODES, StepDemand, slowdown

GpuKey = tuple[int, int]  # (node, GPU index)


class ReplicaState(enum.Enum):
    LOADING = "loading"  # placed, weights loading; not routable yet
    READY = "ready"
    DRAINING = "draining"  # finishing its requests; removed when idle


class Replica:
    __slots__ = (
        "id",
        "model",
        "engine",
        "placements",
        "gpus",
        "state",
        "ready_s",
        "started_s",
        "event_s",
        "size",
        "demand",
    )

    def __init__(
        self,
        replica_id: int,
        model: str,
        engine: Engine,
        placements: Sequence[Placement],
        ready_s: float,
        started_s: float,
    ) -> None:
        self.id = replica_id
        self.model = model
        self.engine = engine
        self.placements = tuple(placements)
        self.gpus: tuple[GpuKey, ...] = tuple((p.node, g) for p in self.placements for g in p.gpu_indices)
        self.state = ReplicaState.LOADING
        self.ready_s = ready_s
        self.started_s = started_s
        self.event_s = float("inf")  # the engine event the twin has queued for it
        self.size = 0  # which of its model's replica sizes it has
        self.demand = StepDemand(step_s=0.0, intensity=1.0)  # what it asks of its GPUs when busy (``interference``)

    @property
    def node(self) -> int:
        return self.placements[0].node


class Fleet:
    """Replicas on a simulated cluster (see the module docstring)."""

    def __init__(
        self,
        nodes: Sequence[NodeSpec],
        placement: str = "bestfit",
        seed: int = 0,
        sharing: str = "time-slice",
        horizon_s: float = math.inf,
    ) -> None:
        if sharing not in SHARING_MODES:
            raise ValueError(f"unknown sharing mode {sharing!r} (known: {', '.join(SHARING_MODES)})")
        self.sharing = sharing
        self.horizon_s = horizon_s  # GPU-seconds are counted up to here
        self.nodes = list(nodes)
        self.state = ClusterState(self.nodes)
        self.placer = Placer(self.state, make_policy(placement))
        self.rng = np.random.default_rng(seed)
        self.replicas: dict[int, Replica] = {}
        self._next_id = 0
        self._on_gpu: dict[GpuKey, list[Replica]] = {}
        self._busy: dict[GpuKey, int] = {}
        self._busy_saturating: dict[GpuKey, float] = {}  # the busy replicas' saturating times, added up
        self.gpus_in_use = 0
        self.peak_gpus = 0
        self.gpu_seconds = 0.0
        self._accounted_to = 0.0

    @property
    def total_gpus(self) -> int:
        return sum(n.gpu_count for n in self.nodes)

    def new_id(self) -> int:
        self._next_id += 1
        return self._next_id - 1

    def place(self, request: Request, shards: int = 1) -> list[Placement] | None:
        """Place and bind ``request`` (``shards`` > 1: that many one-GPU shares on distinct GPUs of one node, a
        tensor-parallel replica under sharing), or None with nothing bound."""
        if shards == 1:
            placement = self.placer.decide(request, self.rng)
            if placement is None:
                return None
            self.state.bind(placement)
            return [placement]
        candidates = self._gang_nodes(request, shards)
        if candidates.size == 0:
            return None
        placed: list[Placement] = []
        fillers: list[Placement] = []  # the rest of each GPU a shard took, held while the next shards are placed
        for _ in range(shards):
            among = candidates if not placed else np.array([placed[0].node], dtype=np.int64)
            placement = self.placer.decide(request, self.rng, among=among)
            if placement is None:  # cannot happen when the candidate check holds; undo rather than trust it
                break
            self.state.bind(placement)
            placed.append(placement)
            fillers.extend(self._fill(placement))
        for filler in fillers:
            self.state.release(filler)
        if len(placed) < shards:
            for p in placed:
                self.state.release(p)
            return None
        gpus = [g for p in placed for g in p.gpu_indices]
        assert len(set(gpus)) == shards, f"shards share a GPU: {placed}"
        return placed

    def _gang_nodes(self, request: Request, shards: int) -> npt.NDArray[np.int64]:
        """The nodes with ``shards`` distinct GPUs that can each take one share of ``request``."""
        nodes = one_node_candidates(self.state, request, shards)
        if nodes.size == 0:
            return nodes
        need = self.state.milli_by_model(request)[self.state.model_idx[nodes]]
        distinct = (self.state.gpu_free_milli[nodes] >= need[:, None]).sum(axis=1) >= shards
        return np.asarray(nodes[distinct], dtype=np.int64)

    def _fill(self, placement: Placement) -> list[Placement]:
        """Bind what is left of the GPU ``placement`` took, so that the gang's next shard lands on another GPU."""
        node, (gpu,) = placement.node, placement.gpu_indices
        free = int(self.state.gpu_free_milli[node, gpu])
        if free <= 0:
            return []
        filler = Placement(node, (gpu,), Request(num_gpus=1, gpu_milli=free), gpu_milli_each=free)
        self.state.bind(filler)
        return [filler]

    def account(self, now_s: float) -> None:
        """Add the GPU-seconds held since the last call, counting only time before the horizon."""
        end = min(now_s, self.horizon_s)
        if end > self._accounted_to:
            self.gpu_seconds += self.gpus_in_use * (end - self._accounted_to)
            self._accounted_to = end

    def add(self, replica: Replica, now_s: float) -> None:
        self.account(now_s)
        self.replicas[replica.id] = replica
        for key in replica.gpus:
            members = self._on_gpu.setdefault(key, [])
            if not members:
                self.gpus_in_use += 1
            members.append(replica)
        self.peak_gpus = max(self.peak_gpus, self.gpus_in_use)

    def remove(self, replica: Replica, now_s: float) -> None:
        self.account(now_s)
        del self.replicas[replica.id]
        for placement in replica.placements:
            self.state.release(placement)
        for key in replica.gpus:
            members = self._on_gpu[key]
            members.remove(replica)
            if not members:
                self.gpus_in_use -= 1
                del self._on_gpu[key]

    def neighbours(self, replica: Replica) -> list[Replica]:
        """The other replicas sharing a GPU with ``replica``."""
        seen: dict[int, Replica] = {}
        for key in replica.gpus:
            for other in self._on_gpu.get(key, ()):
                if other is not replica:
                    seen[other.id] = other
        return list(seen.values())

    def gpus_freed_by(self, replica: Replica) -> int:
        """How many GPUs would hold no replica without ``replica``."""
        return sum(1 for key in replica.gpus if len(self._on_gpu.get(key, ())) == 1)

    def set_busy(self, replica: Replica, busy: bool) -> None:
        step = 1 if busy else -1
        saturating = step * replica.demand.saturating_s
        for key in replica.gpus:
            self._busy[key] = self._busy.get(key, 0) + step
            self._busy_saturating[key] = self._busy_saturating.get(key, 0.0) + saturating

    def slowdown(self, replica: Replica) -> float:
        """How much sharing stretches ``replica``'s iterations now, on its most contended GPU (``interference``)."""
        return max(
            slowdown(self.sharing, self._busy.get(key, 0), self._busy_saturating.get(key, 0.0), replica.demand.step_s)
            for key in replica.gpus
        )


def has_room(replica: Replica, request: InferenceRequest) -> bool:
    """Whether late binding may send ``request`` to ``replica`` now: its engine has nothing waiting and free KV
    cache for the request's prompt and a typical answer (so it is not admitted only to be preempted), or is idle;
    or it runs less urgent work than ``request`` and nothing as urgent waits in it, so that its priority
    preemption lets ``request`` in (an interactive request never waits at the gateway behind a batch flood)."""
    engine = replica.engine
    if not engine.waiting:
        if not engine.running:
            return True
        need = engine.config.blocks_for(request.prompt_tokens + engine.config.predicted_output_tokens)
        if engine.free_blocks >= need and engine.free_blocks >= ROOM_KV_FREE * engine.config.kv_blocks:
            return True
    return engine.yields_to(request.slo)
