"""Queues (tenants) with per-flavor quotas in cohorts, and the ledger that admits work against them.

The words are Kueue's. A queue has a ``nominal`` quota per flavor: capacity guaranteed to it. Queues in the same
``cohort`` lend each other what they do not use: a queue may use up to ``nominal + borrowing_limit`` (no limit when
``borrowing_limit`` is None) and lends at most ``lending_limit`` of its unused nominal quota (all of it when None).
A queue without a cohort never exceeds its nominal quota.

**Flavors are pools.** A demand for GPU model M is charged to the queue's quota entry M when it has one, else to its
``"*"`` entry; without either the queue cannot run M. Within a cohort, the entry key is the pool: a queue borrows
flavor key K only from other queues' entries with the same key K (so ``"*"`` quotas lend to ``"*"`` quotas).

**The arithmetic** (one pool = one cohort and one flavor key, component by component over GPU, CPU, memory). With
usage ``u``, nominal ``N`` and lending limit ``L`` (infinite when None) a queue's *slack* is ``min(N - u, L)``:
positive, it is what the queue lends; negative, it is what it borrows. The ledger keeps every pool at
``sum(slack) >= 0``: everything borrowed is covered by what lenders may lend. Hence a queue Q may hold

    u_Q <= N_Q + min(borrowing_limit_Q, S_others)        S_others = sum of the other members' slack

and the cohort's total usage never exceeds its total nominal quota. ``S_others`` is negative when others borrow
capacity that only Q's unused quota covers: Q then gets that capacity back by reclaiming (``core.preemption``).

``QuotaLedger`` is plain mutable bookkeeping (like ``ClusterState``); the scheduler owns one and changes it only
through ``admit`` and ``release``. Pure: no clock, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal, get_args

from tessera.core.errors import InvalidRequestError
from tessera.core.queueing.resources import ANY_FLAVOR, Flavor, ResourceVector, canonical_flavor

QueueingStrategy = Literal["StrictFIFO", "BestEffortFIFO"]
QUEUEING_STRATEGIES: tuple[str, ...] = get_args(QueueingStrategy)
_UNLIMITED = ResourceVector(2**62, 2**62, 2**62)  # stands for "no limit" inside the arithmetic


@dataclass(frozen=True, slots=True)
class QueueSpec:
    name: str
    cohort: str | None = None  # queues of one cohort lend each other unused quota; None = never borrows or lends
    nominal: Mapping[Flavor, ResourceVector] = field(default_factory=dict)  # guaranteed quota per flavor
    borrowing_limit: Mapping[Flavor, ResourceVector] | None = None  # most borrowed per flavor; None/absent = no limit
    lending_limit: Mapping[Flavor, ResourceVector] | None = None  # most lent per flavor; None/absent = all unused
    weight: float = 1.0  # share of idle capacity relative to other queues (weighted DRF)
    strategy: QueueingStrategy = "StrictFIFO"  # ordering within the queue, see queueing.priority

    def __post_init__(self) -> None:
        if not self.name:
            raise InvalidRequestError("name", "a queue needs a name")
        object.__setattr__(self, "nominal", _checked_quota(self.nominal, "nominal_quota", self.name))
        for limit_field in ("borrowing_limit", "lending_limit"):
            limit = getattr(self, limit_field)
            if limit is None:
                continue
            if self.cohort is None:
                raise InvalidRequestError("cohort", f"queue {self.name}: {limit_field} needs a cohort")
            checked = _checked_quota(limit, limit_field, self.name)
            unknown = sorted(set(checked) - set(self.nominal))
            if unknown:
                raise InvalidRequestError(limit_field, f"queue {self.name}: no nominal quota for flavor {unknown[0]}")
            object.__setattr__(self, limit_field, checked)
        if not (math.isfinite(self.weight) and self.weight > 0):
            raise InvalidRequestError("weight", f"queue {self.name}: must be > 0, got {self.weight}")
        if self.strategy not in QUEUEING_STRATEGIES:
            known = ", ".join(QUEUEING_STRATEGIES)
            raise InvalidRequestError("strategy", f"queue {self.name}: {self.strategy!r} is not one of {known}")

    def flavor_key(self, flavor: Flavor) -> Flavor | None:
        """The quota entry a demand for ``flavor`` is charged to: the flavor itself, else ``"*"``, else None."""
        if flavor in self.nominal:
            return flavor
        return ANY_FLAVOR if ANY_FLAVOR in self.nominal else None


def _checked_quota(quota: Mapping[str, ResourceVector], field_name: str, queue: str) -> Mapping[Flavor, ResourceVector]:
    checked: dict[Flavor, ResourceVector] = {}
    for name, amount in quota.items():
        if not amount.is_non_negative():
            raise InvalidRequestError(field_name, f"queue {queue}, flavor {name}: amounts must be >= 0, got {amount}")
        checked[canonical_flavor(name, field_name)] = amount
    return MappingProxyType(checked)


@dataclass(frozen=True, slots=True)
class Admission:
    """How a demand fits: ``from_nominal + borrowed == demand``; ``borrowed`` comes from the cohort's lendable pool."""

    queue: str
    flavor_key: Flavor  # the quota entry charged (the demanded model or "*")
    from_nominal: ResourceVector  # part covered by the queue's own unused nominal quota
    borrowed: ResourceVector  # part borrowed from other queues of the cohort

    @property
    def is_borrowing(self) -> bool:
        return not self.borrowed.is_zero()

    @property
    def charged(self) -> ResourceVector:
        """The whole demand charged to the queue (own quota plus borrowed)."""
        return self.from_nominal + self.borrowed


@dataclass(frozen=True, slots=True)
class QuotaNeed:
    """What preemption must give back before a demand can be admitted (see ``core.preemption``).

    ``nominal_shortfall``: usage the preemptor's own queue must shed so that the demand runs within nominal quota.
    ``cohort_deficit``: after that, borrowed capacity other queues must return (reclaim) so that the pool balances.
    ``borrow_excess``: if the demand runs by borrowing instead, own usage to shed so that borrowing stays within
    the borrowing limit and the pool; None when the queue cannot borrow (no cohort).
    """

    nominal_shortfall: ResourceVector
    cohort_deficit: ResourceVector
    borrow_excess: ResourceVector | None

    @staticmethod
    def none() -> QuotaNeed:
        """No quota constraint: the demand fits within nominal quota and the cohort as things are."""
        return QuotaNeed(ResourceVector.zero(), ResourceVector.zero(), ResourceVector.zero())


class QuotaLedger:
    """Usage per (queue, flavor key) and the admission rules of the module docstring."""

    def __init__(self, queues: Sequence[QueueSpec]) -> None:
        self._specs: dict[str, QueueSpec] = {}
        for spec in queues:
            if spec.name in self._specs:
                raise InvalidRequestError("name", f"queue {spec.name} is defined twice")
            self._specs[spec.name] = spec
        self._members: dict[str, tuple[str, ...]] = {}
        for spec in queues:
            if spec.cohort is not None:
                self._members[spec.cohort] = (*self._members.get(spec.cohort, ()), spec.name)
        self._usage: dict[tuple[str, Flavor], ResourceVector] = {}

    def copy(self) -> QuotaLedger:
        """An independent ledger with the same queues and usage (to try releases before applying them)."""
        other = QuotaLedger(list(self._specs.values()))
        other._usage = dict(self._usage)
        return other

    @property
    def queues(self) -> tuple[QueueSpec, ...]:
        return tuple(self._specs.values())

    def spec(self, queue: str) -> QueueSpec:
        found = self._specs.get(queue)
        if found is None:
            raise InvalidRequestError("queue", f"unknown queue {queue!r}")
        return found

    # ------------------------------------------------------------------------------------------------ queries

    def usage(self, queue: str, flavor: Flavor) -> ResourceVector:
        key = self._key(queue, flavor)
        return ResourceVector.zero() if key is None else self._used(queue, key)

    def nominal(self, queue: str, flavor: Flavor) -> ResourceVector:
        key = self._key(queue, flavor)
        return ResourceVector.zero() if key is None else self.spec(queue).nominal[key]

    def borrowed(self, queue: str, flavor: Flavor) -> ResourceVector:
        """Usage above nominal quota: capacity this queue currently borrows from its cohort."""
        return (self.usage(queue, flavor) - self.nominal(queue, flavor)).positive_part()

    def lendable(self, queue: str, flavor: Flavor) -> ResourceVector:
        """What this queue may lend now: its unused nominal quota, capped by its lending limit."""
        key = self._key(queue, flavor)
        return ResourceVector.zero() if key is None else self._slack(queue, key).positive_part()

    def reclaimable_for(self, queue: str, flavor: Flavor) -> ResourceVector:
        """The part of this queue's unused nominal quota that borrowers are using: the cohort's borrowing that the
        other members' lendable capacity cannot cover. The queue gets it back only by reclaiming (preemption)."""
        key = self._key(queue, flavor)
        if key is None:
            return ResourceVector.zero()
        uncovered = (ResourceVector.zero() - self._others_slack(queue, key)).positive_part()
        return uncovered.minimum(self._slack(queue, key).positive_part())

    def usage_cap(self, queue: str, flavor: Flavor) -> ResourceVector:
        """The most this queue may hold of ``flavor`` now: ``N + min(borrowing_limit, S_others)`` (N alone without
        a cohort); components may be below N while others borrow this queue's unused quota."""
        key = self._key(queue, flavor)
        if key is None:
            return ResourceVector.zero()
        return self._cap(queue, key)

    def fits_within_nominal(self, queue: str, flavor: Flavor, demand: ResourceVector) -> bool:
        return self.usage(queue, flavor) + demand <= self.nominal(queue, flavor)

    def can_admit(self, queue: str, flavor: Flavor, demand: ResourceVector) -> Admission | None:
        """How ``demand`` would be admitted, or None when admitting it would break a quota rule."""
        _check_demand(demand)
        key = self._key(queue, flavor)
        if key is None:
            return None
        used = self._used(queue, key)
        if not used + demand <= self._cap(queue, key):
            return None
        unused = (self.spec(queue).nominal[key] - used).positive_part()
        from_nominal = demand.minimum(unused)
        return Admission(queue, key, from_nominal, demand - from_nominal)

    def quota_need(self, queue: str, flavor: Flavor, demand: ResourceVector) -> QuotaNeed | None:
        """What preemption must give back for ``demand`` to be admitted; None when no quota entry covers it."""
        _check_demand(demand)
        key = self._key(queue, flavor)
        if key is None:
            return None
        spec = self.spec(queue)
        nominal = spec.nominal[key]
        after = self._used(queue, key) + demand
        shortfall = (after - nominal).positive_part()
        if spec.cohort is None:
            return QuotaNeed(shortfall, ResourceVector.zero(), None)
        others = self._others_slack(queue, key)
        own_slack = self._limit(spec.lending_limit, key, nominal).minimum(nominal - after.minimum(nominal))
        deficit = (ResourceVector.zero() - others - own_slack).positive_part()
        excess = (after - self._cap(queue, key)).positive_part()
        return QuotaNeed(shortfall, deficit, excess)

    # ------------------------------------------------------------------------------------------------ changes

    def admit(
        self, queue: str, flavor: Flavor, demand: ResourceVector, admission: Admission | None = None
    ) -> Admission:
        """Charge ``demand`` to the queue. ``admission`` (from ``can_admit``) must still be what ``can_admit`` says
        now; a demand that no longer fits raises ``InvalidRequestError("demand", ...)``."""
        fresh = self.can_admit(queue, flavor, demand)
        if fresh is None or (admission is not None and admission != fresh):
            raise InvalidRequestError("demand", f"queue {queue}: {demand} does not fit its quota now")
        key = fresh.flavor_key
        self._usage[(queue, key)] = self._used(queue, key) + demand
        return fresh

    def release(self, queue: str, flavor: Flavor, demand: ResourceVector) -> None:
        """Return ``demand`` (admitted earlier) to the queue's quota."""
        _check_demand(demand)
        key = self._key(queue, flavor)
        if key is not None:
            left = self._used(queue, key) - demand
            if left.is_non_negative():
                self._usage[(queue, key)] = left
                return
        raise InvalidRequestError("demand", f"queue {queue}: releasing {demand} of {flavor} it does not hold")

    # ------------------------------------------------------------------------------------------------ internals

    def _key(self, queue: str, flavor: Flavor) -> Flavor | None:
        return self.spec(queue).flavor_key(canonical_flavor(flavor))

    def _used(self, queue: str, key: Flavor) -> ResourceVector:
        return self._usage.get((queue, key), ResourceVector.zero())

    @staticmethod
    def _limit(limits: Mapping[Flavor, ResourceVector] | None, key: Flavor, default: ResourceVector) -> ResourceVector:
        return default if limits is None else limits.get(key, default)

    def _slack(self, queue: str, key: Flavor) -> ResourceVector:
        """min(N - u, lending limit): lendable when positive, borrowed when negative."""
        spec = self._specs[queue]
        nominal = spec.nominal[key]
        return (nominal - self._used(queue, key)).minimum(self._limit(spec.lending_limit, key, _UNLIMITED))

    def _others_slack(self, queue: str, key: Flavor) -> ResourceVector:
        cohort = self._specs[queue].cohort
        total = ResourceVector.zero()
        for other in self._members.get(cohort, ()) if cohort is not None else ():
            if other != queue and key in self._specs[other].nominal:
                total = total + self._slack(other, key)
        return total

    def _cap(self, queue: str, key: Flavor) -> ResourceVector:
        spec = self._specs[queue]
        nominal = spec.nominal[key]
        if spec.cohort is None:
            return nominal
        borrow = self._limit(spec.borrowing_limit, key, _UNLIMITED)
        return nominal + borrow.minimum(self._others_slack(queue, key))


def _check_demand(demand: ResourceVector) -> None:
    if not demand.is_non_negative():
        raise InvalidRequestError("demand", f"amounts must be >= 0, got {demand}")
