"""A fingerprint of every decision a policy makes in one seeded arrival-inflation run.

Speed work on a policy must not change where it places anything. ``placement_digest`` replays the experiment of
``inflation.run_inflation`` (same seeded node order and arrival sequence) and hashes each decision (node and GPU
indices, or none), so two implementations can be compared decision for decision, and a test can pin the digest
that an earlier implementation produced.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

from tessera.core.cluster import ClusterState, NodeSpec
from tessera.core.fragmentation import typical_pods
from tessera.core.placement import Placer, TieBreak, make_policy
from tessera.core.workload import MILLI_PER_GPU, Request
from tessera.sim.placement_study.inflation import inflate_requests


def placement_digest(
    nodes: Sequence[NodeSpec], requests: Sequence[Request], policy_name: str, seed: int, inflate: float = 1.3
) -> tuple[str, int]:
    """SHA-256 over the run's decisions, and how many pods were placed."""
    rng = np.random.default_rng(seed)
    capacity_milli = sum(n.gpu_count for n in nodes) * MILLI_PER_GPU
    arrivals = inflate_requests(requests, capacity_milli, inflate, rng)
    by_name = sorted(nodes, key=lambda n: n.name)
    state = ClusterState([by_name[i] for i in rng.permutation(len(by_name))])
    typical = typical_pods(requests)
    placer = Placer(state, make_policy(policy_name, typical, state.model_names), TieBreak.FIRST)
    digest = hashlib.sha256()
    placed = 0
    for request in arrivals:
        placement = placer.decide(request, rng)
        if placement is None:
            digest.update(b"-;")
            continue
        state.bind(placement)
        placed += 1
        digest.update(f"{placement.node}:{','.join(map(str, placement.gpu_indices))};".encode())
    return digest.hexdigest(), placed
