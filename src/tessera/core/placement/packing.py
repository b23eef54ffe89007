"""GpuPacking: fill already-shared GPUs first, then free GPUs on used nodes, then idle nodes.

Scores: a request whose GPUs all come from partly used GPUs scores ``max(100 - r / 10, 50)`` where ``r`` is the
free share (percent) of the GPUs it would take, so the fullest GPU wins; one that needs fully free GPUs on a used
node scores ``max(50 - n, 33)`` for ``n`` free GPUs taken; an idle node scores ``33 - gpu_count``. The GPUs
considered are the least-free ones that fit. CPU-only requests score 0 everywhere.
"""

from __future__ import annotations

import numpy as np

from tessera.core.cluster import ClusterState, IntArray
from tessera.core.placement.base import BasePolicy, NodeScores, no_gpu_choice
from tessera.core.workload import MILLI_PER_GPU, Request


class PackingPolicy(BasePolicy):
    name = "packing"

    def score_nodes(self, state: ClusterState, request: Request, nodes: IntArray, need_milli: IntArray) -> NodeScores:
        if request.num_gpus == 0:
            return NodeScores(np.zeros(nodes.size), no_gpu_choice(nodes.size))
        exists = state.gpu_exists[nodes]
        free = np.where(exists, state.gpu_free_milli[nodes], -1)  # padding sorts first and never fits
        counts = state.gpu_count[nodes]
        idle_node = ((free == MILLI_PER_GPU) | ~exists).all(axis=1)
        ordered = np.sort(free, axis=1, kind="stable")
        fits = ordered >= need_milli[:, None]
        taken = fits & (np.cumsum(fits, axis=1) <= request.num_gpus)
        whole_taken = (taken & (ordered == MILLI_PER_GPU)).sum(axis=1)
        free_pct = np.where(taken, ordered * 100 // MILLI_PER_GPU, 0).sum(axis=1)
        score = np.where(
            idle_node,
            33 - counts,
            np.where(whole_taken > 0, np.maximum(50 - whole_taken, 33), np.maximum(100 - free_pct // 10, 50)),
        )
        return NodeScores(score.astype(np.float64), no_gpu_choice(nodes.size))
