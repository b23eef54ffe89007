"""Tessera-hetero: ``hetero``'s choice of GPU model, then Tessera's fragmentation measure, learnt online.

A node's rank has up to three parts, compared lexicographically:

1. **Speed** (requests with a job type): only nodes of the GPU model the job type runs fastest on among the feasible
   ones (``HeteroPolicy.speed_units``, no tolerance), as ``hetero`` does.
2. **Packing** (``within="pack"``; for whole-GPU and CPU-only requests also under ``within="shares"``): only the
   nodes with the highest best-fit score ``trunc(100 · (1 − leftover))``, as ``hetero`` and ``bestfit`` rank them.
3. **Fragmentation**: ``tessera-online``'s score, the decrease of Tessera's node fragmentation measure learnt from
   the requests seen (``placement.tessera``, ``online=True``) less its charges for taking one of the last hosts of a
   multi-GPU shape and for taking GPU types that constrained pods need. A sharing request takes the GPU of the node
   that this measure prefers (before the first model, 64 workers learnt, the best-fitting GPU, as ``hetero``).

``within="frag"`` skips the packing part. With a co-location model a typed share joins only a GPU the co-location
rule leaves open (``HeteroPolicy.open_gpu``: the best-fitting one that holds no other typed job or one with which
sharing is a net gain), and its fragmentation score is the measure's decrease for that GPU; a node without an open
GPU is infeasible for it.

Unlike ``tessera``, the workload model is never given: it is learnt from the workloads the scheduler is offered,
each worker once, when its workload is first offered (``learn``, called by ``Scheduler.plan``; ``tessera-online``
instead learns from every placement attempt, so from retries too). What it learns depends on the workloads alone,
not on how often a runtime steps, so the simulator and the control plane, which has no trace to take typical pods
from, build the same policy and teach it the same. A placer used without a scheduler (the placement study) teaches
it nothing: it then breaks best-fit ties by an empty model, i.e. places like ``hetero``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import numpy as np

from tessera.core.cluster import ClusterState, IntArray
from tessera.core.fragmentation import FloatArray
from tessera.core.placement.base import INFEASIBLE, BasePolicy, NodeScores, best_fit_gpu
from tessera.core.placement.hetero import NO_GPU_CHOICE_CLOSED, HeteroPolicy, packing_scores
from tessera.core.placement.tessera import TesseraParams, TesseraPolicy
from tessera.core.throughput import ColocationModel, ThroughputModel
from tessera.core.workload import MILLI_PER_GPU, Request

Within = Literal["pack", "frag", "shares"]
WITHIN: tuple[Within, ...] = ("pack", "frag", "shares")


class _OnlineTessera(TesseraPolicy):
    """``tessera-online`` that can also score a sharing request on a GPU chosen for it."""

    def score_on(
        self, state: ClusterState, request: Request, nodes: IntArray, need: IntArray, gpus: IntArray
    ) -> FloatArray:
        """``F_before - F_after`` of ``request`` taking ``need[k]`` on GPU ``gpus[k]`` of ``nodes[k]``; keeps the
        reserve's lost shapes for that choice, as ``score_nodes`` keeps them for its own."""
        free = state.gpu_free_milli[nodes]
        after = free.copy()
        after[np.arange(nodes.size), gpus] -= need
        cpu, mem, models = state.cpu_free_milli[nodes], state.mem_free_mib[nodes], state.model_idx[nodes]
        before = self.frag.node_frag(cpu, free, models, mem)
        later = self.frag.node_frag(cpu - request.scoring_cpu_milli, after, models, mem - request.mem_mib)
        if self.reserve.weight > 0:
            taken = (free[np.arange(nodes.size), gpus] == MILLI_PER_GPU).astype(np.int64)
            bits = self.reserve.lost_bits(state, request, nodes, taken, free)
            if bits is not None:
                lost_bits, shapes_known = self._lost.arrays(state, request)
                lost_bits[nodes] = bits
                shapes_known[nodes] = self.reserve.shapes
        return np.asarray(before - later, dtype=np.float64)


class TesseraHeteroPolicy(BasePolicy):
    """The fastest GPU model for the job type, then (with ``within="pack"``) best fit, then Tessera's measure."""

    name = "tessera-hetero"
    node_local = True

    def __init__(
        self,
        throughput: ThroughputModel,
        model_names: tuple[str, ...] | list[str],
        job_type_of: Callable[[Request], str | None] | None = None,
        colocation: ColocationModel | None = None,
        *,
        within: Within = "pack",
        params: TesseraParams | None = None,
    ) -> None:
        if within not in WITHIN:
            raise ValueError(f"within must be one of {WITHIN}, got {within!r}")
        self.hetero = HeteroPolicy(throughput, job_type_of, colocation=colocation)
        self.frag = _OnlineTessera((), model_names, online=True, params=params or TesseraParams())
        self.within: Within = within
        self.model_version = self.frag.model_version
        self._job_type: str | None = None  # of the request being placed

    def observe(self, request: Request) -> None:
        self._job_type = self.hetero.job_type(request)

    def learn(self, request: Request) -> None:
        """Learn one worker of a workload offered for the first time (``placement.base.Learner``): the typical pods
        (refit after 64, 128, ... 1,024 workers, then every 1,024), the multi-GPU shapes of the reserve and the GPU
        types constrained pods need."""
        self.frag.observe(request)
        self.model_version = self.frag.model_version

    def score_nodes(self, state: ClusterState, request: Request, nodes: IntArray, need_milli: IntArray) -> NodeScores:
        scored = self.frag.score_nodes(state, request, nodes, need_milli)
        if request.num_gpus != 1:
            return scored
        job_type = self.hetero.job_type(request)
        ruled = self.hetero.colocation is not None and job_type is not None
        if not ruled and self.frag.model_version > 0:
            return scored  # the measure's GPU
        sharing = (need_milli < MILLI_PER_GPU).nonzero()[0]
        if not sharing.size:
            return scored
        # The GPU the co-location rule leaves open (best fit among those), or before any model the best-fitting one.
        score, gpu = scored.score.copy(), scored.gpu.copy()
        for k in sharing.tolist():
            node, need = int(nodes[k]), int(need_milli[k])
            if ruled:
                gpu[k] = self.hetero.open_gpu(state, node, need, job_type or "")
            else:
                gpu[k] = best_fit_gpu(state.gpu_free_milli[node, : state.gpu_count[node]], need)
        closed = sharing[gpu[sharing] == NO_GPU_CHOICE_CLOSED]
        moved = sharing[(gpu[sharing] != NO_GPU_CHOICE_CLOSED) & (gpu[sharing] != scored.gpu[sharing])]
        if moved.size:
            score[moved] = self.frag.score_on(state, request, nodes[moved], need_milli[moved], gpu[moved])
        score[closed] = INFEASIBLE
        return NodeScores(score, gpu)

    def adjust(
        self, state: ClusterState, request: Request, nodes: IntArray, need_milli: IntArray, scored: NodeScores
    ) -> FloatArray:
        """Tessera's final score on the nodes of the best speed (and packing) tier; the others are out of the race.

        Tessera's own ``adjust`` is exact only for the nodes that can be best among those it is given, so it is
        given only the tier."""
        tier = self.tier(state, request, nodes, need_milli)
        final = np.full(nodes.size, INFEASIBLE)
        final[tier] = self.frag.adjust(
            state, request, nodes[tier], need_milli[tier], NodeScores(scored.score[tier], scored.gpu[tier])
        )
        return final

    def tier(self, state: ClusterState, request: Request, nodes: IntArray, need_milli: IntArray) -> IntArray:
        """Positions in ``nodes`` (feasible, non-empty) of the best speed tier, and within it of the best packing
        score when this request is ranked by packing."""
        keep = np.ones(nodes.size, dtype=np.bool_)
        job_type = self._job_type
        if job_type is not None:
            units = self.hetero.speed_units(state, request, job_type)[state.model_idx[nodes]]
            keep = units == units.max()
        sharing = request.num_gpus == 1 and bool((need_milli < MILLI_PER_GPU).any())
        if self.within == "pack" or (self.within == "shares" and not sharing):
            packing = packing_scores(state, request, nodes, need_milli)
            keep &= packing == packing[keep].max()
        return keep.nonzero()[0]
