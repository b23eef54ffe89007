"""What a GPU's free share is worth to the workload still to come, priced by a bin-packing linear program.

Treat every GPU as a bin of 1,000 milli and the workload's sharing pods as items arriving with the typical-pod mix.
The fluid cutting-stock LP ("pack this mix into as few GPUs as possible", integrality relaxed) has one dual price
``y[s]`` per share ``s``: the fraction of a GPU that a pod of that share costs in the best packing of the mix.
An 810-milli pod costs a whole GPU when the mix has few pods that fit its 190-milli remainder; two 470s share a GPU,
so each costs half.

A free share ``g`` is worth ``V(g)``: the most that pods of the mix fitting in ``g`` are worth together (an
unbounded knapsack over the prices). Its *gap waste* is ``g - 1000 * V(g)`` milli. Putting a pod of share ``s`` on a
GPU with ``g`` free changes the waste by ``1000 * (y[s] + regret) - s``, where
``regret = V(g) - V(g - s) - y[s] >= 0`` is zero exactly when the placement is consistent with a best packing of the
mix. The waste therefore prices each remainder by how the whole mix could still fill it, with the supply of small
pods taken into account, where a per-GPU fill model (``random_fill_waste``) sees only which pods fit.

The LP is an arc-flow model of one GPU (positions 0..1000 in steps of the shares' gcd, one arc per share, unit
idle arcs), solved with HiGHS through scipy; it is small (about 2,000 arcs for 20 shares in steps of 10 milli).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
from scipy.optimize import linprog
from scipy.sparse import coo_matrix, csr_matrix

from tessera.core.fragmentation import FloatArray, TypicalPod
from tessera.core.workload import MILLI_PER_GPU


def share_mix(pods: Sequence[TypicalPod]) -> dict[int, float]:
    """Popularity of each per-GPU share below a whole GPU among the single-GPU typical pods."""
    mix: dict[int, float] = {}
    for pod in pods:
        if pod.num_gpus == 1 and 0 < pod.gpu_milli < MILLI_PER_GPU:
            mix[pod.gpu_milli] = mix.get(pod.gpu_milli, 0.0) + pod.popularity
    return mix


def share_prices(mix: Mapping[int, float]) -> dict[int, float]:
    """Dual price (fraction of a GPU) of each share in the fluid LP that packs ``mix`` into the fewest GPUs."""
    return packing_lp(mix)[0]


def packing_lp(mix: Mapping[int, float]) -> tuple[dict[int, float], float]:
    """The fewest GPUs that hold ``mix`` (share -> how many pods, or their popularity) with integrality relaxed, and
    the dual price of each share. With counts it is a lower bound on the GPUs any packing of those pods needs."""
    shares = sorted(s for s, weight in mix.items() if weight > 0 and 0 < s < MILLI_PER_GPU)
    if not shares:
        return {}, 0.0
    step = math.gcd(MILLI_PER_GPU, *shares)
    last = MILLI_PER_GPU // step
    flow_rows: list[int] = []
    flow_cols: list[int] = []
    flow_vals: list[float] = []
    demand_rows: list[int] = []
    demand_cols: list[int] = []
    index_of = {share: index for index, share in enumerate(shares)}
    arc = 0
    for start, end, share in gpu_arcs(shares, step):
        flow_rows += [start, end]
        flow_cols += [arc, arc]
        flow_vals += [-1.0, 1.0]
        if share is not None:
            demand_rows.append(index_of[share])
            demand_cols.append(arc)
        arc += 1
    gpus = arc  # the return arc last -> 0 carries the number of GPUs used
    flow_rows += [0, last]
    flow_cols += [gpus, gpus]
    flow_vals += [1.0, -1.0]
    arcs = gpus + 1
    conservation = _sparse(flow_vals, flow_rows, flow_cols, (last + 1, arcs))
    # sum of the arcs of share s >= mix[s], written as -sum <= -mix[s]
    demand = _sparse([-1.0] * len(demand_rows), demand_rows, demand_cols, (len(shares), arcs))
    cost = np.zeros(arcs)
    cost[gpus] = 1.0
    result = linprog(  # type: ignore[call-overload]  # HiGHS takes sparse matrices; the stubs list dense ones only
        cost,
        A_ub=demand,
        b_ub=-np.array([mix[s] for s in shares]),
        A_eq=conservation,
        b_eq=np.zeros(last + 1),
        # On the usual 10-milli grid the simplex takes a few ms; shares off that grid (gcd 1) make the model 10x
        # larger, where the interior-point method (with crossover) is about 3x faster than the simplex.
        method="highs" if last <= 100 else "highs-ipm",
    )
    if result.status != 0:  # pragma: no cover - the LP is always feasible and bounded
        raise RuntimeError(f"share pricing LP failed: {result.message}")
    prices = np.maximum(-np.asarray(result.ineqlin.marginals, dtype=np.float64), 0.0)
    return {share: float(price) for share, price in zip(shares, prices, strict=True)}, float(result.fun)


def gpu_arcs(shares: Sequence[int], step: int) -> list[tuple[int, int, int | None]]:
    """The arcs of the arc-flow model of one GPU, on positions 0..1000 in units of ``step`` milli: from each
    position an idle arc to the next (share None), then one arc per share that still fits."""
    last = MILLI_PER_GPU // step
    arcs: list[tuple[int, int, int | None]] = []
    for position in range(last):
        arcs.append((position, position + 1, None))
        arcs.extend((position, position + share // step, share) for share in shares if position + share // step <= last)
    return arcs


def _sparse(values: list[float], rows: list[int], cols: list[int], shape: tuple[int, int]) -> csr_matrix:
    return coo_matrix((np.array(values), (np.array(rows), np.array(cols))), shape=shape).tocsr()


def gap_waste(prices: Mapping[int, float]) -> FloatArray:
    """``waste[g] = g - 1000 * V(g)`` for ``g`` in 0..1000, ``V(g)`` the most the priced shares fitting ``g`` are
    worth together (``waste[0] = waste[1000] = 0``). Without prices (no sharing pods) the table is all zero."""
    if not prices:
        return np.zeros(MILLI_PER_GPU + 1)
    shares = np.array(sorted(prices), dtype=np.int64)
    values = np.array([prices[s] for s in sorted(prices)], dtype=np.float64)
    # Every sum of shares is a multiple of their gcd, so V only changes on that grid: solve on it, then spread.
    step = math.gcd(MILLI_PER_GPU, *shares.tolist())
    units = shares // step
    best = np.zeros(MILLI_PER_GPU // step + 1)
    for free in range(1, best.size):
        fit = units <= free
        candidates = best[free - units[fit]] + values[fit]
        best[free] = max(best[free - 1], float(candidates.max())) if candidates.size else best[free - 1]
    milli = np.arange(MILLI_PER_GPU + 1)
    return milli.astype(np.float64) - MILLI_PER_GPU * best[milli // step]


def typical_gap_waste(pods: Sequence[TypicalPod]) -> FloatArray:
    """``gap_waste`` of the LP prices of the typical pods' sharing mix."""
    return gap_waste(share_prices(share_mix(pods)))
