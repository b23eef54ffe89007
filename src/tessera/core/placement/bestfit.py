"""BestFit: prefer the node with the least CPU and GPU left over after placement.

Leftovers are normalised by the largest node shape (128 cores, 8 GPUs) and weighted equally; the raw integer
score ``100 * (1 - leftover)`` is min-max normalised to 0..100 (integer) across the scored nodes.
"""

from __future__ import annotations

import numpy as np

from tessera.core.cluster import ClusterState, IntArray
from tessera.core.placement.base import BasePolicy, FloatArray, NodeScores, no_gpu_choice
from tessera.core.placement.dotprod import MAX_NODE_CPU_MILLI, MAX_NODE_GPU_MILLI
from tessera.core.workload import Request


class BestFitPolicy(BasePolicy):
    name = "bestfit"

    def score_nodes(self, state: ClusterState, request: Request, nodes: IntArray, need_milli: IntArray) -> NodeScores:
        cpu_after = state.cpu_free_milli[nodes] - request.scoring_cpu_milli
        gpu_after = state.gpu_free_milli[nodes].sum(axis=1) - need_milli * request.num_gpus
        leftover = 0.5 * cpu_after / MAX_NODE_CPU_MILLI + 0.5 * gpu_after / MAX_NODE_GPU_MILLI
        return NodeScores(np.trunc((1.0 - leftover) * 100.0), no_gpu_choice(nodes.size))

    def normalize(self, scores: FloatArray) -> FloatArray:
        low, high = scores.min(), scores.max()
        if high == low:
            return np.zeros_like(scores)
        return np.asarray(np.floor((scores - low) * 100.0 / (high - low)), dtype=np.float64)
