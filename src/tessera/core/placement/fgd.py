"""FGD: place where the node's fragmentation grows least (Weng et al., "Beware of Fragmentation", ATC '23).

Score = integer part of ``100 * sigmoid((F_before - F_after) / 1000)`` with ``F`` the node fragmentation against
the typical-pod workload. A sharing request tries every GPU that fits and keeps the best score (first on ties);
a whole-GPU request takes the lowest-indexed free GPUs.
"""

from __future__ import annotations

import numpy as np

from tessera.core.cluster import ClusterState, IntArray
from tessera.core.fragmentation import FloatArray, FragmentationModel
from tessera.core.placement.base import BasePolicy, NodeScores, no_gpu_choice
from tessera.core.workload import MILLI_PER_GPU, Request

MAX_NODE_SCORE = 100


def frag_delta_score(before: FloatArray, after: FloatArray) -> FloatArray:
    """Integer score 0..100 that grows as the placement adds less fragmentation."""
    return np.floor(MAX_NODE_SCORE / (1.0 + np.exp(-(before - after) / 1000.0)))


def take_whole_gpus(free: IntArray, counts: int) -> IntArray:
    """``free`` (K x G) after taking the ``counts`` lowest-indexed completely free GPUs on every row."""
    whole = free == MILLI_PER_GPU
    taken = whole & (np.cumsum(whole, axis=1) <= counts)
    return np.where(taken, 0, free)


class FgdPolicy(BasePolicy):
    name = "fgd"

    def __init__(self, frag: FragmentationModel) -> None:
        self.frag = frag

    def delta_score(self, before: FloatArray, after: FloatArray) -> FloatArray:
        """How good it is to move a node from fragmentation ``before`` to ``after`` (higher is better)."""
        return frag_delta_score(before, after)

    def frag_now(
        self, state: ClusterState, nodes: IntArray, cpu: IntArray, free: IntArray, models: IntArray, mem: IntArray
    ) -> FloatArray:
        """The fragmentation of ``nodes`` as they are now (their free ``cpu``, GPU milli ``free``, ``models`` and
        ``mem``, read from ``state``); a policy may keep it between decisions."""
        return self.frag.node_frag(cpu, free, models, mem)

    def score_nodes(self, state: ClusterState, request: Request, nodes: IntArray, need_milli: IntArray) -> NodeScores:
        cpu, mem = state.cpu_free_milli[nodes], state.mem_free_mib[nodes]
        free = state.gpu_free_milli[nodes]
        models = state.model_idx[nodes]
        before = self.frag_now(state, nodes, cpu, free, models, mem)
        cpu_after, mem_after = cpu - request.scoring_cpu_milli, mem - request.mem_mib
        # A memory-sized request can be a share on a large GPU model and a whole GPU on a small one.
        sharing = (need_milli < MILLI_PER_GPU) if request.num_gpus == 1 else np.zeros(nodes.size, dtype=np.bool_)
        score = np.empty(nodes.size)
        gpu = no_gpu_choice(nodes.size)
        if sharing.any():
            part = self._score_sharing(
                before[sharing],
                cpu_after[sharing],
                mem_after[sharing],
                free[sharing],
                models[sharing],
                need_milli[sharing],
            )
            score[sharing], gpu[sharing] = part.score, part.gpu
        whole = ~sharing
        if whole.any():
            free_after = take_whole_gpus(free[whole], request.num_gpus) if request.num_gpus else free[whole]
            after = self.frag.node_frag(cpu_after[whole], free_after, models[whole], mem_after[whole])
            score[whole] = self.delta_score(before[whole], after)
        return NodeScores(score, gpu)

    def _score_sharing(
        self,
        before: FloatArray,
        cpu_after: IntArray,
        mem_after: IntArray,
        free: IntArray,
        models: IntArray,
        need: IntArray,
    ) -> NodeScores:
        k, g = free.shape
        # Candidates (node i, GPU j): GPUs that fit, skipping a GPU whose free share equals an earlier GPU's on the
        # same node (same after-state, and the first index wins ties anyway). Idle nodes shrink to one candidate.
        fits = free >= need[:, None]
        same_as_earlier = ((free[:, :, None] == free[:, None, :]) & np.tri(g, g, -1, dtype=np.bool_)[None]).any(axis=2)
        rows, cols = np.nonzero(fits & ~same_as_earlier)
        free_after = free[rows].copy()
        free_after[np.arange(rows.size), cols] -= need[rows]
        after = self.frag.node_frag(cpu_after[rows], free_after, models[rows], mem_after[rows])
        scores = np.full((k, g), -np.inf)
        scores[rows, cols] = self.delta_score(before[rows], after)
        best_gpu = np.argmax(scores, axis=1)  # first index on ties
        return NodeScores(scores[np.arange(k), best_gpu], best_gpu.astype(np.int64))
