"""A lower bound on unallocated GPU % in the inflation experiment that no placement policy can beat.

Usage: python bench/placement_bound.py [--traces default,cpu250] [--seeds 42-43] [--buckets 100,130]

For each trace and seed it rebuilds the experiment's arrival sequence (``inflate_requests``, same seed), takes the
arrivals up to the first one at which the arrived GPU request reaches the bucket's share of capacity, and solves a
linear relaxation of "place as much GPU volume of these pods as possible", with hindsight and in any order:

- GPUs: per node type (model, GPUs per node, CPU, memory), an arc-flow model of one GPU (positions 0..1000 milli in
  steps of the shares' gcd; an arc per share, a whole-GPU arc, unit loss arcs). It is exact for how shares can
  stack on one GPU; only integrality is relaxed.
- CPU and host memory: the pods put on a node type use at most the type's total CPU and memory (not per node).
- Multi-GPU pods take whole GPUs of a node type with enough GPUs per node (not necessarily on one node).
- A pod's GPU model restriction and per-node fit (GPUs, CPU, memory) are kept.

Any policy's allocation at that arrival is a feasible integer point of this relaxation, so
``100 - LP optimum / capacity`` is a lower bound on its unallocated %. At 130% arrived the bound is weak: with
hindsight the relaxation can drop awkward pods and take whole-GPU ones instead, which no online policy that places
every pod it can would do.
"""

from __future__ import annotations

import argparse
import math
import statistics
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from scipy.optimize import linprog
from scipy.sparse import coo_matrix, csr_matrix

from tessera.core.cluster import NodeSpec
from tessera.core.gap_prices import gpu_arcs
from tessera.core.workload import MILLI_PER_GPU, Request
from tessera.sim.placement_study.inflation import inflate_requests
from tessera.sim.placement_study.inputs import load_inputs
from tessera.sim.placement_study.published import load_published
from tessera.sim.placement_study.sweep import parse_seeds

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "traces"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", default="")
    parser.add_argument("--seeds", default="42-43")
    parser.add_argument("--buckets", default="100,130")
    parser.add_argument("--cpu-first", action="store_true", help="place as many CPU-only pods as possible first")
    args = parser.parse_args()
    published = load_published(SHARED / "fgd-results" / "analysis_allo_discrete.csv")
    traces = sorted({trace for trace, _ in published})
    if args.traces:
        traces = [t for t in traces if t.removeprefix("openb_pod_list_") in args.traces.split(",")]
    buckets = [int(b) for b in args.buckets.split(",")]
    seeds = parse_seeds(args.seeds)
    print("| trace | arrived | FGD published | bound (mean of seeds) | max reduction vs published |")
    print("|---|---:|---:|---:|---:|")
    reductions: dict[int, list[float]] = {b: [] for b in buckets}
    for trace in traces:
        inputs = load_inputs(SHARED / "openb" / "openb_node_list_gpu_node.csv", SHARED / "openb" / f"{trace}.csv")
        capacity = inputs.gpus * MILLI_PER_GPU
        for bucket in buckets:
            bounds = []
            for seed in seeds:
                arrivals = inflate_requests(inputs.requests, capacity, 1.3, np.random.default_rng(seed))
                prefix = _prefix(arrivals, bucket / 100.0 * capacity)
                bounds.append(100.0 - 100.0 * max_allocated(inputs.nodes, prefix, args.cpu_first) / capacity)
            bound = statistics.mean(bounds)
            pub = published[(trace, "fgd")].mean(bucket)
            reductions[bucket].append(100.0 * (pub - bound) / pub)
            name = trace.removeprefix("openb_pod_list_")
            print(f"| {name} | {bucket}% | {pub:.2f} | {bound:.2f} | {reductions[bucket][-1]:+.1f}% |", flush=True)
    for bucket in buckets:
        print(f"mean max reduction at {bucket}%: {statistics.mean(reductions[bucket]):+.1f}%")
    print(f"mean max reduction, all: {statistics.mean(r for rs in reductions.values() for r in rs):+.1f}%")


def _prefix(arrivals: list[Request], limit: float) -> list[Request]:
    arrived = 0
    for i, request in enumerate(arrivals):
        arrived += request.total_gpu_milli
        if arrived >= limit:
            return arrivals[: i + 1]
    return arrivals


def _sparse(entries: list[tuple[int, int, float]], rows: int, cols: int) -> csr_matrix:
    """The ``rows`` x ``cols`` matrix of (row, column, value) ``entries`` (repeated positions add up)."""
    values = np.array([x for _, _, x in entries], dtype=np.float64)
    at = (np.array([r for r, _, _ in entries], dtype=np.int64), np.array([c for _, c, _ in entries], dtype=np.int64))
    return coo_matrix((values, at), shape=(rows, cols)).tocsr()


def max_allocated(nodes: Sequence[NodeSpec], requests: list[Request], cpu_first: bool = False) -> float:
    """The LP optimum: most GPU milli of ``requests`` that the relaxation can place on ``nodes``.

    ``cpu_first``: among the solutions that place the most CPU-only pod CPU (as a scheduler that never holds CPU
    work back for GPU work would), the one that places the most GPU milli.
    """
    node_types = Counter((n.gpu_model, n.gpu_count, n.cpu_milli, n.mem_mib) for n in nodes if n.gpu_count > 0)
    classes = Counter((r.num_gpus, r.gpu_milli, r.gpu_types, r.cpu_milli, r.mem_mib) for r in requests)
    shares = sorted({g for n, g, *_ in classes if n == 1 and 0 < g < MILLI_PER_GPU})
    step = math.gcd(MILLI_PER_GPU, *shares)
    positions = MILLI_PER_GPU // step + 1
    objective: list[float] = []
    cpu_only: list[tuple[int, float]] = []  # (variable, CPU milli) of CPU-only pods
    upper: list[float] = []
    rows_eq, rows_ub = 0, 0
    eq: list[tuple[int, int, float]] = []
    ub: list[tuple[int, int, float]] = []
    b_eq: list[float] = []
    b_ub: list[float] = []

    def new_var(obj: float, hi: float | None) -> int:
        objective.append(-obj)
        upper.append(math.inf if hi is None else hi)
        return len(objective) - 1

    count_row = {c: i for i, c in enumerate(classes)}
    b_ub.extend(float(n) for n in classes.values())
    rows_ub = len(classes)
    for (model, gpus, cpu, mem), count in node_types.items():
        # Flow conservation rows for positions 0..1000 of this type's GPU; link rows per share and for whole GPUs.
        base = rows_eq
        rows_eq += positions
        b_eq.extend([float(gpus * count)] + [0.0] * (positions - 2) + [-float(gpus * count)])
        link = {s: rows_eq + k for k, s in enumerate([*shares, MILLI_PER_GPU])}
        rows_eq += len(link)
        b_eq.extend([0.0] * len(link))

        def arc(start: int, end: int, share: int | None, base: int = base, link: dict[int, int] = link) -> None:
            v = new_var(0.0, None)
            eq.append((base + start, v, 1.0))
            eq.append((base + end, v, -1.0))
            if share is not None:
                eq.append((link[share], v, 1.0))

        for start, end, share in gpu_arcs(shares, step):  # idle milli and one arc per share
            arc(start, end, share)
        arc(0, positions - 1, MILLI_PER_GPU)
        cpu_row, mem_row = rows_ub, rows_ub + 1
        rows_ub += 2
        b_ub.extend([float(cpu * count), float(mem * count)])
        for c in classes:
            num_gpus, share, types, pod_cpu, pod_mem = c
            if num_gpus > gpus or pod_cpu > cpu or pod_mem > mem or (types and model not in types):
                continue
            v = new_var(float(num_gpus * share), None)
            if num_gpus == 0:
                cpu_only.append((v, float(pod_cpu)))
            ub.append((count_row[c], v, 1.0))
            ub.append((cpu_row, v, float(pod_cpu)))
            ub.append((mem_row, v, float(pod_mem)))
            if num_gpus == 1 and 0 < share < MILLI_PER_GPU:
                eq.append((link[share], v, -1.0))
            elif num_gpus > 0:
                eq.append((link[MILLI_PER_GPU], v, -float(num_gpus)))
    n = len(objective)
    a_eq = _sparse(eq, rows_eq, n)
    bounds = list(zip([0.0] * n, upper, strict=True))
    if cpu_first and cpu_only:
        cpu_objective = np.zeros(n)
        for v, cpu_milli in cpu_only:
            cpu_objective[v] = -cpu_milli
        a_ub_first = _sparse(ub, rows_ub, n)
        first = linprog(  # type: ignore[call-overload]  # HiGHS takes sparse matrices; the stubs list dense ones only
            cpu_objective, A_ub=a_ub_first, b_ub=b_ub, A_eq=a_eq, b_eq=b_eq, bounds=bounds, method="highs"
        )
        if not first.success:
            raise RuntimeError(first.message)
        rows_ub += 1
        for v, cpu_milli in cpu_only:
            ub.append((rows_ub - 1, v, -cpu_milli))
        b_ub.append(float(first.fun) * (1 - 1e-7))
    result = linprog(  # type: ignore[call-overload]  # as above
        objective,
        A_ub=_sparse(ub, rows_ub, n),
        b_ub=b_ub,
        A_eq=a_eq,
        b_eq=b_eq,
        bounds=bounds,
        method="highs",
    )
    if not result.success:
        raise RuntimeError(result.message)
    return float(-result.fun)


if __name__ == "__main__":
    main()
