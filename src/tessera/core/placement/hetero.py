"""Hetero: heterogeneity-aware placement — the GPU type a job trains fastest on first, then best-fit packing.

A node's score has two parts, compared lexicographically:

1. **Speed**: the isolated throughput the request's job type gets on the node's GPU model
   (``ThroughputModel.throughput``: measured where the table says, else scaled by the GPU's relative speed),
   relative to the fastest model among the feasible nodes. Nodes within ``speed_tolerance`` of that best count as
   equally fast. A request's effective throughput is this per-GPU rate times its GPU count (or share), the same
   factor on every node, so the per-GPU rate alone orders the nodes.
2. **Packing** (the tie-breaker among equally fast nodes): BestFit's integer score ``100 · (1 − leftover)``, least
   CPU and GPU left over after placement, so that among GPUs of equal speed the policy packs exactly as
   ``BestFitPolicy`` does.

Requests carry no job type today, so the job type comes from ``job_type_of(request)`` (a pure function of the
request: the engine caches scores per request value). A request without a job type (``job_type_of`` is ``None``
or returns ``None``) and a CPU-only request are placed entirely by ``base`` (``BestFitPolicy`` by default), so with
no job types this policy *is* its base.

Scores stay node-local (``node_local = True``): ``score_nodes`` encodes the speed (in 0.1 % of the fastest model
the request may use in this cluster, a constant per request) and the packing score in one exact float, and
``normalize`` — which sees every feasible node's score — decodes them and applies the tolerance against the best
*feasible* node. ``observe`` records whether the request being placed is scored this way or by ``base``, since
``normalize`` is called for that same request.

**Co-location** (with a ``ColocationModel``). A sharing (fractional) training request placed on a GPU that already
runs another training job slows both. ``ClusterState.job_types_on`` records the job types of the sharing workloads
on each GPU, and a GPU is open to a sharing request with a job type only when it holds no other such workload, or
exactly one whose pairing with it is a net gain (``should_colocate``: the two slowed jobs together do more than one
alone would). The model measures pairs, so a GPU never takes a third. Among the open GPUs of a node the request
takes the best-fitting one; a node without an open GPU is infeasible for it. Workloads without a job type (services,
notebooks) are not constrained by this rule and do not count as partners.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from tessera.core.cluster import ClusterState, IntArray
from tessera.core.errors import InvalidRequestError
from tessera.core.placement.base import (
    INFEASIBLE,
    BasePolicy,
    FloatArray,
    NodeScores,
    PlacementPolicy,
    no_gpu_choice,
)
from tessera.core.placement.bestfit import BestFitPolicy
from tessera.core.placement.dotprod import MAX_NODE_CPU_MILLI, MAX_NODE_GPU_MILLI
from tessera.core.throughput import ColocationModel, ThroughputModel
from tessera.core.workload import MILLI_PER_GPU, Request

JobTypeOf = Callable[[Request], str | None]

SPEED_UNITS = 1000  # speed resolution: 0.1 % of the fastest allowed model
_PACK_SPAN = 1_000_000  # encoded score = speed_units * _PACK_SPAN + packing + _PACK_OFFSET
_PACK_OFFSET = _PACK_SPAN // 2  # packing scores are clipped into [-_PACK_OFFSET, _PACK_OFFSET)
NO_GPU_CHOICE_CLOSED = -2  # a node whose GPUs the co-location rule closes to the request


def should_colocate(colocation: ColocationModel, job_a: str, job_b: str, gpu_model: str) -> bool:
    """Whether ``job_a`` and ``job_b`` should share one ``gpu_model`` GPU: only when sharing is a net gain.

    Net gain = factor_a + factor_b − 1 (each factor the co-located ÷ isolated throughput): sharing saves GPU time
    only when the two slowed jobs together do more than one job alone would.
    """
    return colocation.net_gain(job_a, job_b, gpu_model) > 0.0


def packing_scores(state: ClusterState, request: Request, nodes: IntArray, need_milli: IntArray) -> FloatArray:
    """BestFit's raw score ``trunc(100 · (1 − leftover))`` on ``nodes`` (higher = less CPU and GPU left over)."""
    cpu_after = state.cpu_free_milli[nodes] - request.scoring_cpu_milli
    gpu_after = state.gpu_free_milli[nodes].sum(axis=1) - need_milli * request.num_gpus
    leftover = 0.5 * cpu_after / MAX_NODE_CPU_MILLI + 0.5 * gpu_after / MAX_NODE_GPU_MILLI
    return np.asarray(np.trunc((1.0 - leftover) * 100.0), dtype=np.float64)


class HeteroPolicy(BasePolicy):
    """Fastest GPU type for the request's job type first, then best-fit packing; ``base`` places the rest."""

    name = "hetero"
    node_local = True

    def __init__(
        self,
        throughput: ThroughputModel,
        job_type_of: JobTypeOf | None = None,
        base: PlacementPolicy | None = None,
        speed_tolerance: float = 0.0,
        colocation: ColocationModel | None = None,
    ) -> None:
        if not 0.0 <= speed_tolerance < 1.0:
            raise InvalidRequestError("speed_tolerance", f"must be in [0, 1), got {speed_tolerance}")
        self.throughput = throughput
        self.job_type_of = job_type_of
        self.base: PlacementPolicy = base if base is not None else BestFitPolicy()
        self.speed_tolerance = speed_tolerance  # relative speed gap still counted as "equally fast"
        self.colocation = colocation  # None: sharing GPUs regardless of interference
        self.node_local = self.base.node_local
        self.model_version = self.base.model_version
        self._by_speed = False  # whether the request being placed is scored by speed (else by ``base``)
        self._units: dict[tuple[str, tuple[str, ...], frozenset[str]], IntArray] = {}

    def job_type(self, request: Request) -> str | None:
        """The request's job type, or ``None`` when it has none or asks for no GPU (then ``base`` decides)."""
        if self.job_type_of is None or request.num_gpus == 0:
            return None
        return self.job_type_of(request)

    def observe(self, request: Request) -> None:
        self.base.observe(request)
        self.model_version = self.base.model_version
        self._by_speed = self.job_type(request) is not None

    def score_nodes(self, state: ClusterState, request: Request, nodes: IntArray, need_milli: IntArray) -> NodeScores:
        job_type = self.job_type(request)
        if job_type is None:
            return self.base.score_nodes(state, request, nodes, need_milli)
        units = self.speed_units(state, request, job_type)[state.model_idx[nodes]]
        packing = np.clip(packing_scores(state, request, nodes, need_milli), -_PACK_OFFSET, _PACK_OFFSET - 1)
        encoded = units.astype(np.float64) * _PACK_SPAN + packing + _PACK_OFFSET
        gpus = no_gpu_choice(nodes.size)
        if self.colocation is not None and request.num_gpus == 1:
            for k, node in enumerate(nodes.tolist()):
                if need_milli[k] < MILLI_PER_GPU:
                    gpus[k] = self.open_gpu(state, node, int(need_milli[k]), job_type)
            encoded = np.where(gpus == NO_GPU_CHOICE_CLOSED, INFEASIBLE, encoded)
        return NodeScores(encoded, gpus)

    def open_gpu(self, state: ClusterState, node: int, need_milli: int, job_type: str) -> int:
        """The best-fitting GPU of ``node`` that a ``job_type`` share may join under the co-location rule, or
        ``NO_GPU_CHOICE_CLOSED`` when none may."""
        assert self.colocation is not None
        model = state.nodes[node].gpu_model or ""
        free = state.gpu_free_milli[node, : state.gpu_count[node]]
        best, best_free = NO_GPU_CHOICE_CLOSED, MILLI_PER_GPU + 1
        for gpu in np.flatnonzero(free >= need_milli).tolist():
            partners = state.job_types_on(node, gpu)
            if len(partners) > 1 or (partners and not should_colocate(self.colocation, job_type, partners[0], model)):
                continue
            if free[gpu] < best_free:
                best, best_free = gpu, int(free[gpu])
        return best

    def normalize(self, scores: FloatArray) -> FloatArray:
        if not self._by_speed:
            return self.base.normalize(scores)
        units = np.floor(scores / _PACK_SPAN)
        packing = scores - units * _PACK_SPAN  # packing + _PACK_OFFSET, in [0, _PACK_SPAN)
        relative = units / units.max()
        fast = relative >= 1.0 - self.speed_tolerance - 0.5 / SPEED_UNITS
        # Equally fast nodes land in [1, 2) ordered by packing; slower ones keep their relative speed, below 1.
        return np.asarray(np.where(fast, 1.0 + packing / _PACK_SPAN, relative), dtype=np.float64)

    def choose_gpu(self, free: IntArray, need_milli: int, rng: np.random.Generator) -> int:
        if not self._by_speed:
            return self.base.choose_gpu(free, need_milli, rng)
        return super().choose_gpu(free, need_milli, rng)

    def pick_node(self, best: IntArray, rng: np.random.Generator) -> int | None:
        return None if self._by_speed else self.base.pick_node(best, rng)

    def speed_units(self, state: ClusterState, request: Request, job_type: str) -> IntArray:
        """Per model index (CPU-only last, 0): the job type's speed in 0.1 % of the fastest model it may use."""
        key = (job_type, state.model_names, request.gpu_types)
        cached = self._units.get(key)
        if cached is not None:
            return cached
        rates = np.array([self.throughput.throughput(job_type, m) for m in state.model_names] + [0.0])
        allowed = state.allowed_models(request)
        best = rates[allowed].max() if allowed.any() else 1.0  # rates are > 0: ThroughputModel validates them
        scaled = np.clip(np.rint(rates / best * SPEED_UNITS), 1, SPEED_UNITS)
        units = np.asarray(np.where(allowed, scaled, 1), dtype=np.int64)
        self._units[key] = units
        return units
