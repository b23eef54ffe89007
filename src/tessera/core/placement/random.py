"""Random: a uniformly random feasible node; a sharing request takes a uniformly random GPU that fits.

The draw is the policy's own (``pick_node``), so it stays random whatever tie-break rule the engine uses.
"""

from __future__ import annotations

import numpy as np

from tessera.core.cluster import ClusterState, IntArray
from tessera.core.placement.base import BasePolicy, NodeScores, no_gpu_choice
from tessera.core.workload import Request


class RandomPolicy(BasePolicy):
    name = "random"

    def score_nodes(self, state: ClusterState, request: Request, nodes: IntArray, need_milli: IntArray) -> NodeScores:
        return NodeScores(np.zeros(nodes.size), no_gpu_choice(nodes.size))

    def pick_node(self, best: IntArray, rng: np.random.Generator) -> int:
        return int(best[rng.integers(best.size)])

    def choose_gpu(self, free: IntArray, need_milli: int, rng: np.random.Generator) -> int:
        fitting = np.flatnonzero(free >= need_milli)
        return int(fitting[rng.integers(fitting.size)])
