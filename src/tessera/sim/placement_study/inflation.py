"""The FGD study's "arrival inflation" experiment, run with Tessera's own placement engine.

Pods only arrive, one at a time, and never leave; a pod that cannot be placed is dropped. The pod list is shuffled
with the seed and random copies of its pods are appended until the total GPU request would pass ``inflate`` times
the cluster's GPU capacity. Nodes are sorted by name, then put in a seed-dependent random order, and equally
scored nodes go to the first one in that order (``TieBreak.FIRST``), as in the study's simulator. The rule matters:
with a uniformly random tie-break FGD leaves twice as many GPUs unallocated on the default trace, because every
idle 8-GPU node gets nibbled by small pods; with plain name order the CPU-heavy traces pile CPU-only pods onto the
first nodes by name. After each arrival we sample the allocated and arrived GPU milli and the cluster's
fragmentation against the trace's typical pods. ``bucketize`` turns samples into the per-"arrived %" curves that the
study reports. Called by the CLI (``tessera simulate fgd``) and by the benchmarks and fidelity tests.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from tessera.core.cluster import ClusterState, NodeSpec
from tessera.core.fragmentation import FragmentationModel, typical_pods
from tessera.core.invariants import check_cluster
from tessera.core.placement import Placer, TieBreak, make_policy
from tessera.core.workload import MILLI_PER_GPU, Placement, Request
from tessera.sim.kernel import EventLoop

FloatArray = npt.NDArray[np.float64]
MAX_BUCKET = 130


@dataclass(frozen=True, slots=True)
class RunSamples:
    """One sample per arrival (in milli-GPU), plus the decision timings of the run."""

    policy: str
    seed: int
    capacity_milli: int
    arrived_milli: FloatArray
    allocated_milli: FloatArray
    frag_milli: FloatArray
    idle_milli: FloatArray
    decision_s: FloatArray  # wall time of each placement decision
    placed: int

    @property
    def arrivals(self) -> int:
        return int(self.arrived_milli.size)


@dataclass(frozen=True, slots=True)
class BucketCurves:
    """Per arrived-% bucket 0..130: mean allocation %, fragmentation % of capacity, fragmentation % of idle."""

    alloc_pct: FloatArray
    frag_pct: FloatArray
    frag_ratio_pct: FloatArray

    def unallocated_pct(self, bucket: int) -> float:
        return float(100.0 - self.alloc_pct[bucket])


def inflate_requests(
    requests: Sequence[Request], capacity_milli: int, factor: float, rng: np.random.Generator
) -> list[Request]:
    """The shuffled requests plus random copies until the total GPU request would exceed ``factor`` x capacity."""
    shuffled = [requests[i] for i in rng.permutation(len(requests))]
    limit = factor * capacity_milli
    total = sum(r.total_gpu_milli for r in requests)
    if not any(r.total_gpu_milli for r in requests):
        return shuffled
    while True:
        copy = requests[int(rng.integers(len(requests)))]
        if total + copy.total_gpu_milli > limit:
            return shuffled
        shuffled.append(copy)
        total += copy.total_gpu_milli


def run_inflation(
    nodes: Sequence[NodeSpec],
    requests: Sequence[Request],
    policy_name: str,
    seed: int,
    inflate: float = 1.3,
    check_invariants: bool = False,
    tie_break: TieBreak = TieBreak.FIRST,
) -> RunSamples:
    """One (policy, seed) run of the experiment on ``nodes`` with the trace's ``requests`` (in trace order)."""
    rng = np.random.default_rng(seed)
    capacity_milli = sum(n.gpu_count for n in nodes) * MILLI_PER_GPU
    arrivals = inflate_requests(requests, capacity_milli, inflate, rng)
    by_name = sorted(nodes, key=lambda n: n.name)
    state = ClusterState([by_name[i] for i in rng.permutation(len(by_name))])
    typical = typical_pods(requests)
    frag_model = FragmentationModel(typical, state.model_names)
    placer = Placer(state, make_policy(policy_name, typical, state.model_names), tie_break)

    n = len(arrivals)
    arrived, allocated, frag, idle, decision_s = (np.zeros(n) for _ in range(5))
    node_frag = frag_model.node_frag(state.cpu_free_milli, state.gpu_free_milli, state.model_idx)
    placements: list[Placement] = []
    totals = {"arrived": 0, "allocated": 0}

    def on_arrival(_now: float, index: int) -> None:
        request = arrivals[index]
        started = time.perf_counter()
        placement = placer.decide(request, rng)
        decision_s[index] = time.perf_counter() - started
        totals["arrived"] += request.total_gpu_milli
        if placement is not None:
            state.bind(placement)
            placements.append(placement)
            totals["allocated"] += placement.total_gpu_milli
            k = placement.node
            node_frag[k] = frag_model.node_frag(
                state.cpu_free_milli[k : k + 1], state.gpu_free_milli[k : k + 1], state.model_idx[k : k + 1]
            )[0]
            if check_invariants:
                check_cluster(state, placements)
        arrived[index] = totals["arrived"]
        allocated[index] = totals["allocated"]
        frag[index] = node_frag.sum()
        idle[index] = state.gpu_capacity_milli - totals["allocated"]

    loop: EventLoop[int] = EventLoop()
    for i in range(n):
        loop.schedule(float(i), i)
    loop.run(on_arrival)
    return RunSamples(
        policy_name, seed, state.gpu_capacity_milli, arrived, allocated, frag, idle, decision_s, len(placements)
    )


def bucketize(samples: RunSamples) -> BucketCurves:
    """Mean of each sampled series per arrived-% bucket (round half to even); an empty bucket borrows k +- 1."""
    capacity = samples.capacity_milli
    bucket = np.rint(samples.arrived_milli * 100.0 / capacity).astype(np.int64)
    alloc = samples.allocated_milli * 100.0 / capacity
    frag = samples.frag_milli * 100.0 / capacity
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(samples.idle_milli > 0, samples.frag_milli * 100.0 / samples.idle_milli, 0.0)
    return BucketCurves(*(_bucket_means(bucket, series) for series in (alloc, frag, ratio)))


def _bucket_means(bucket: npt.NDArray[np.int64], values: FloatArray) -> FloatArray:
    size = MAX_BUCKET + 1
    inside = (bucket >= 0) & (bucket <= MAX_BUCKET)
    sums = np.bincount(bucket[inside], weights=values[inside], minlength=size)[:size]
    counts = np.bincount(bucket[inside], minlength=size)[:size]
    means = np.full(size, np.nan)
    np.divide(sums, counts, out=means, where=counts > 0)
    for k in np.flatnonzero(counts == 0):
        window = slice(max(k - 1, 0), min(k + 2, size))
        if counts[window].sum():
            means[k] = sums[window].sum() / counts[window].sum()
    return means
