"""GpuClustering: keep requests of one kind together.

A node scores ``25 * used_share`` (integer, the share of 8 GPUs already taken) plus 75 when it only runs GPU
workloads of the request's kind (``share`` or ``N-gpu``), 50 when it runs that kind among others, 25 when it runs
no GPU workload, 0 when it runs only other kinds. CPU-only requests score 0 everywhere (a random feasible node).
"""

from __future__ import annotations

import numpy as np

from tessera.core.cluster import ClusterState, IntArray
from tessera.core.placement.base import BasePolicy, NodeScores, no_gpu_choice
from tessera.core.placement.dotprod import MAX_NODE_GPU_MILLI
from tessera.core.workload import Request


def _kind_bonus(kinds: dict[str, int], kind: str) -> int:
    if not kinds:
        return 25
    if kind in kinds:
        return 75 if len(kinds) == 1 else 50
    return 0


class ClusteringPolicy(BasePolicy):
    name = "clustering"

    def score_nodes(self, state: ClusterState, request: Request, nodes: IntArray, need_milli: IntArray) -> NodeScores:
        if request.num_gpus == 0:
            return NodeScores(np.zeros(nodes.size), no_gpu_choice(nodes.size))
        used = MAX_NODE_GPU_MILLI - state.gpu_free_milli[nodes].sum(axis=1)
        base = np.sign(used) * ((25 * np.abs(used)) // MAX_NODE_GPU_MILLI)  # integer division toward zero
        kind = request.kind
        bonus = np.array([_kind_bonus(state.gpu_kinds[int(n)], kind) for n in nodes], dtype=np.int64)
        return NodeScores((base + bonus).astype(np.float64), no_gpu_choice(nodes.size))
