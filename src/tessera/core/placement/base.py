"""The placement engine and the contract every placement policy fulfils.

A policy scores feasible nodes for one request (``score_nodes``), optionally rescales the scores across all scored
nodes (``normalize``), and may pick the GPU a sharing request takes on each node. The engine (``Placer``) does the
rest the way the Kubernetes scheduler does: filter the feasible nodes, score every one of them and keep the highest
score. Ties go to the first node in cluster order (``TieBreak.FIRST``, what the FGD study's simulator does and
what reproduces its numbers) or to a uniformly random one drawn from the injected RNG (``TieBreak.RANDOM``).

Scores of a ``node_local`` policy depend only on that node's state and the request, so the engine caches them per
request shape and recomputes only the nodes whose ``ClusterState.version`` changed since: one placement changes one
node, which makes a decision over a thousand nodes cost a handful of node evaluations instead of all of them. Nodes
that join later (``ClusterState.add_node``) extend the cached arrays; drained and removed ones bump their version and
are rescored (infeasible).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from tessera.core.cluster import ClusterState, IntArray
from tessera.core.workload import MILLI_PER_GPU, Placement, Request

FloatArray = npt.NDArray[np.float64]

INFEASIBLE = -np.inf
NO_GPU_CHOICE = -1


class TieBreak(enum.Enum):
    FIRST = "first"  # the first best node in cluster order: deterministic, packs work onto fewer nodes
    RANDOM = "random"  # a uniformly random best node (kube-scheduler's reservoir sampling)


@dataclass(frozen=True, slots=True)
class NodeScores:
    score: FloatArray  # one per scored node, higher is better
    gpu: IntArray  # GPU a sharing request takes on that node, NO_GPU_CHOICE to let the engine best-fit


class PlacementPolicy(Protocol):
    name: str
    node_local: bool  # scores depend only on (node state, request, model_version): the engine may cache them
    model_version: int  # bumped when the policy's own model changes; the engine then drops its cached scores

    def observe(self, request: Request) -> None:
        """Called once per request before it is placed: an online policy learns the workload here."""
        ...

    def score_nodes(self, state: ClusterState, request: Request, nodes: IntArray, need_milli: IntArray) -> NodeScores:
        """Scores for the feasible ``nodes``; ``need_milli`` is the request's per-GPU share on each of them."""
        ...

    def normalize(self, scores: FloatArray) -> FloatArray:
        """Final scores from the raw scores of every feasible node (identity for most policies)."""
        ...

    def adjust(
        self, state: ClusterState, request: Request, nodes: IntArray, need_milli: IntArray, scored: NodeScores
    ) -> FloatArray:
        """The final scores of the feasible ``nodes`` (``scored``: their scores so far and the GPU ``score_nodes``
        chose on each) with what depends on the whole cluster added; the engine caches only the node-local part.
        Identity by default."""
        ...

    def choose_gpu(self, free: IntArray, need_milli: int, rng: np.random.Generator) -> int:
        """The GPU a sharing request takes on the chosen node when ``score_nodes`` left it open."""
        ...

    def pick_node(self, best: IntArray, rng: np.random.Generator) -> int | None:
        """The node among the equally best ``best`` (cluster order), or ``None`` for the engine's tie-break rule."""
        ...


@runtime_checkable
class Learner(Protocol):
    """A policy that learns the workload from the workloads it is offered, once each, rather than from every
    placement it is asked for (``observe``, called again at each attempt, each trial and each probe).

    ``Scheduler.plan`` calls ``learn`` for every worker of a pending workload the first time the workload is offered
    to it, so what the policy learns depends on the workloads alone, not on how often a runtime steps: the
    simulator's event-driven steps and the server's continual ones teach it the same. It may change the policy's
    ``model_version`` (the engine then drops its cached scores at the next decision)."""

    def learn(self, request: Request) -> None: ...


class BasePolicy:
    """Defaults shared by the built-in policies."""

    name = "base"
    node_local = True
    model_version = 0

    def observe(self, request: Request) -> None:
        return None

    def normalize(self, scores: FloatArray) -> FloatArray:
        return scores

    def adjust(
        self, state: ClusterState, request: Request, nodes: IntArray, need_milli: IntArray, scored: NodeScores
    ) -> FloatArray:
        return scored.score

    def choose_gpu(self, free: IntArray, need_milli: int, rng: np.random.Generator) -> int:
        return best_fit_gpu(free, need_milli)

    def pick_node(self, best: IntArray, rng: np.random.Generator) -> int | None:
        return None


def no_gpu_choice(count: int) -> IntArray:
    return np.full(count, NO_GPU_CHOICE, dtype=np.int64)


def best_fit_gpu(free: IntArray, need_milli: int) -> int:
    """The GPU with the least free share that still fits ``need_milli`` (lowest index on ties)."""
    masked = np.where(free >= need_milli, free, MILLI_PER_GPU + 1)
    return int(np.argmin(masked))


@dataclass(slots=True)
class _ShapeCache:
    score: FloatArray
    gpu: IntArray
    need_milli: IntArray
    seen_version: IntArray


def _grow(entry: _ShapeCache, need_milli: IntArray) -> None:
    """Extend ``entry`` to the nodes of ``need_milli`` (one per node now); the new nodes are stale."""
    extra = need_milli.size - entry.score.size
    entry.score = np.concatenate([entry.score, np.full(extra, INFEASIBLE)])
    entry.gpu = np.concatenate([entry.gpu, no_gpu_choice(extra)])
    entry.need_milli = need_milli
    entry.seen_version = np.concatenate([entry.seen_version, np.full(extra, -1, dtype=np.int64)])


class Placer:
    """Chooses a node (and GPUs) for one request at a time on one ``ClusterState``; never changes the state."""

    def __init__(self, state: ClusterState, policy: PlacementPolicy, tie_break: TieBreak = TieBreak.FIRST) -> None:
        self.state = state
        self.policy = policy
        self.tie_break = tie_break
        self._cache: dict[Request, _ShapeCache] = {}
        self._cache_version = policy.model_version

    def decide(self, request: Request, rng: np.random.Generator, among: IntArray | None = None) -> Placement | None:
        """Where ``request`` goes now, or ``None`` when no node can host it; ``among`` limits the choice to those
        node indices (sorted), e.g. the nodes that can hold a whole gang."""
        self.policy.observe(request)
        if self.policy.model_version != self._cache_version:
            self._cache.clear()
            self._cache_version = self.policy.model_version
        entry = self._scores_for(request)
        feasible = np.flatnonzero(entry.score > INFEASIBLE)
        if among is not None:
            feasible = np.intersect1d(feasible, among, assume_unique=True)
        if feasible.size == 0:
            return None
        final = self.policy.normalize(entry.score[feasible])
        final = self.policy.adjust(
            self.state, request, feasible, entry.need_milli[feasible], NodeScores(final, entry.gpu[feasible])
        )
        ties = feasible[final == final.max()]
        picked = self.policy.pick_node(ties, rng)
        if picked is not None:
            node = picked
        elif ties.size == 1 or self.tie_break is TieBreak.FIRST:
            node = int(ties[0])
        else:
            node = int(ties[rng.integers(ties.size)])
        return self._placement_on(node, request, int(entry.need_milli[node]), int(entry.gpu[node]), rng)

    def _scores_for(self, request: Request) -> _ShapeCache:
        state = self.state
        entry = self._cache.get(request)
        if entry is None:
            n = state.num_nodes
            need = state.milli_by_model(request)[state.model_idx]
            entry = _ShapeCache(np.full(n, INFEASIBLE), no_gpu_choice(n), need, np.full(n, -1, dtype=np.int64))
            self._cache[request] = entry
        elif entry.score.size < state.num_nodes:  # nodes joined since: their entries start stale
            _grow(entry, state.milli_by_model(request)[state.model_idx])
        if self.policy.node_local:
            stale = np.flatnonzero(entry.seen_version != state.version)
        else:
            stale = np.arange(state.num_nodes)
        if stale.size:
            self._refresh(entry, request, stale)
        return entry

    def _refresh(self, entry: _ShapeCache, request: Request, stale: IntArray) -> None:
        state = self.state
        feasible_mask = state.feasible(request, stale, entry.need_milli[stale])
        entry.score[stale] = INFEASIBLE
        entry.gpu[stale] = NO_GPU_CHOICE
        nodes = stale[feasible_mask]
        if nodes.size:
            scored = self.policy.score_nodes(state, request, nodes, entry.need_milli[nodes])
            entry.score[nodes] = scored.score
            entry.gpu[nodes] = scored.gpu
        entry.seen_version[stale] = state.version[stale]

    def _placement_on(
        self, node: int, request: Request, need_milli: int, gpu_choice: int, rng: np.random.Generator
    ) -> Placement:
        if request.num_gpus == 0:
            return Placement(node, (), request, 0)
        free = self.state.gpu_free_milli[node]
        if request.num_gpus == 1 and need_milli < MILLI_PER_GPU:
            gpu = gpu_choice if gpu_choice != NO_GPU_CHOICE else self.policy.choose_gpu(free, need_milli, rng)
            return Placement(node, (gpu,), request, need_milli)
        whole = np.flatnonzero(free == MILLI_PER_GPU)[: request.num_gpus]
        return Placement(node, tuple(int(g) for g in whole), request, MILLI_PER_GPU)
