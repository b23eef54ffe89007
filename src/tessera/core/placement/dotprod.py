"""DotProd (Tetris-style alignment): prefer the node whose free (CPU, GPU) vector has the smallest dot product
with the request, both normalised by the largest node shape (128 cores, 8 GPUs).

Score = integer part of ``100 * (1 - dot / 2)``. A sharing request takes the best-fitting GPU.
"""

from __future__ import annotations

import numpy as np

from tessera.core.cluster import ClusterState, IntArray
from tessera.core.placement.base import BasePolicy, NodeScores, no_gpu_choice
from tessera.core.workload import Request

MAX_NODE_CPU_MILLI = 128_000
MAX_NODE_GPU_MILLI = 8_000


class DotProdPolicy(BasePolicy):
    name = "dotprod"

    def score_nodes(self, state: ClusterState, request: Request, nodes: IntArray, need_milli: IntArray) -> NodeScores:
        cpu_req = request.scoring_cpu_milli
        cpu_left = state.cpu_free_milli[nodes]
        gpu_left = state.gpu_free_milli[nodes].sum(axis=1)
        dot = (cpu_left / MAX_NODE_CPU_MILLI) * (cpu_req / MAX_NODE_CPU_MILLI) + (gpu_left / MAX_NODE_GPU_MILLI) * (
            need_milli * request.num_gpus / MAX_NODE_GPU_MILLI
        )
        score = np.where(cpu_left >= cpu_req, np.floor(100.0 * (1.0 - dot / 2.0)), 0.0)
        return NodeScores(score, no_gpu_choice(nodes.size))
