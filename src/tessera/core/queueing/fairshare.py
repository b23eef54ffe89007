"""Weighted fair share between queues: DRF ordering and the entitlement each queue is owed.

**Ordering (weighted DRF).** A queue's dominant share is the largest fraction of the cluster's capacity it holds over
GPU, CPU and memory (Ghodsi et al., *Dominant Resource Fairness*, NSDI 2011); weighted, it is divided by the queue's
weight. ``drf_order`` lists queues lowest weighted dominant share first (ties by name): the scheduler offers
capacity to pending work in that order, so the queue furthest below its share goes first.

**Entitlement** (what a queue is owed at an instant, in GPU milli; used to judge a policy's fairness over time).
A queue is owed its nominal quota as far as it has demand, plus a weighted fair share of the idle capacity of its
cohort among the queues whose demand exceeds their nominal quota:

1. ``N_q`` = the queue's nominal GPU milli summed over flavors, scaled down proportionally when the quotas add up to
   more than ``capacity`` (borrowing and lending limits are absolute, not scaled); ``D_q`` = its demand;
   ``base_q = min(D_q, N_q)``.
2. A queue without a cohort is owed ``base_q``. In a cohort the idle pool is ``sum(min(N_q - base_q, lend_q))``
   (lending limits hold back the rest), and each queue can take up to ``room_q = min(D_q, N_q + borrow_q) - base_q``.
3. The pool is shared by water-filling (``water_fill``): raise a common level ``x``; each queue gets
   ``min(room_q, x * weight_q)``; stop when the pool is spent or every room is full. Queues whose room is below
   their weighted level are filled and their unused fair share goes to the others.

Flavors are summed: the entitlement is exact when each queue's work uses one flavor pool. Pure functions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

from tessera.core.queueing.quotas import QueueSpec
from tessera.core.queueing.resources import Flavor, ResourceVector


class QueueUsage(NamedTuple):
    name: str
    weight: float
    usage: ResourceVector


def dominant_share(usage: ResourceVector, capacity: ResourceVector) -> float:
    """The largest fraction of ``capacity`` that ``usage`` takes over all resources (zero-capacity ones ignored)."""
    return usage.dominant_share(capacity)


def drf_order(queues: Sequence[tuple[str, float, ResourceVector]], capacity: ResourceVector) -> list[str]:
    """Queue names, lowest weighted dominant share (share / weight) first; ties by name."""
    keyed = sorted((dominant_share(usage, capacity) / weight, name) for name, weight, usage in queues)
    return [name for _, name in keyed]


def water_fill(pool: float, claims: Sequence[tuple[str, float, float]]) -> dict[str, float]:
    """Share ``pool`` among ``(name, weight, room)`` claims by weighted water-filling (see the module docstring).

    Every claim gets ``min(room, level * weight)`` for the one level that spends the pool, or its whole room when
    the pool covers every room. O(n log n): claims are filled in order of ``room / weight``.
    """
    given = {name: 0.0 for name, _, _ in claims}
    active = sorted((room / weight, name, weight, room) for name, weight, room in claims if room > 0 and weight > 0)
    weight_left = sum(weight for _, _, weight, _ in active)
    left = max(pool, 0.0)
    for i, (_, name, weight, room) in enumerate(active):
        if left <= 0:
            break
        level = left / weight_left
        if room <= level * weight:
            given[name] = room
            left -= room
            weight_left -= weight
            continue
        for _, rest_name, rest_weight, _ in active[i:]:
            given[rest_name] = level * rest_weight
        break
    return given


def entitlement(
    queues: Sequence[QueueSpec], capacity: ResourceVector, demands: Mapping[str, ResourceVector]
) -> dict[str, float]:
    """Each queue's entitlement in GPU milli: nominal quota up to demand plus a weighted fair share of its cohort's
    idle capacity (module docstring). Queues missing from ``demands`` have no demand."""
    nominal = {q.name: float(_gpu_sum(q.nominal)) for q in queues}
    total_nominal = sum(nominal.values())
    if total_nominal > capacity.gpu_milli:  # quotas promise more than exists: scale the guarantees down
        scale = max(capacity.gpu_milli, 0) / total_nominal
        nominal = {name: amount * scale for name, amount in nominal.items()}
    demand = {q.name: float(demands.get(q.name, ResourceVector.zero()).gpu_milli) for q in queues}
    owed = {name: min(demand[name], nominal[name]) for name in nominal}
    cohorts: dict[str, list[QueueSpec]] = {}
    for q in queues:
        if q.cohort is not None:
            cohorts.setdefault(q.cohort, []).append(q)
    for members in cohorts.values():
        pool = 0.0
        claims: list[tuple[str, float, float]] = []
        for q in members:
            unused = nominal[q.name] - owed[q.name]
            pool += min(unused, _limit_sum(q.lending_limit, q.nominal, unused))
            ceiling = min(demand[q.name], nominal[q.name] + _limit_sum(q.borrowing_limit, q.nominal, float("inf")))
            claims.append((q.name, q.weight, max(ceiling - owed[q.name], 0.0)))
        for name, extra in water_fill(pool, claims).items():
            owed[name] += extra
    return owed


def _gpu_sum(quota: Mapping[Flavor, ResourceVector]) -> int:
    return sum(amount.gpu_milli for amount in quota.values())


def _limit_sum(
    limits: Mapping[Flavor, ResourceVector] | None, nominal: Mapping[Flavor, ResourceVector], unlimited: float
) -> float:
    """A limit summed over the queue's flavors; a flavor without a limit counts as ``unlimited``."""
    if limits is None:
        return unlimited
    total = 0.0
    for flavor in nominal:
        if flavor not in limits:
            return unlimited
        total += limits[flavor].gpu_milli
    return total
