"""Multi-tenant queueing: quotas in cohorts (Kueue's words), weighted DRF fair share, priority classes and ordering.

``quotas`` holds the quota arithmetic (``QueueSpec``, ``QuotaLedger``), ``fairshare`` the DRF order and entitlement,
``priority`` the priority classes and the StrictFIFO / BestEffortFIFO orders; victim selection for preemption lives
in ``tessera.core.preemption``. Everything here is pure.
"""

from tessera.core.queueing.fairshare import QueueUsage, dominant_share, drf_order, entitlement, water_fill
from tessera.core.queueing.priority import (
    BEST_EFFORT,
    BUILTIN_PRIORITY_CLASSES,
    INFERENCE_CRITICAL,
    TRAINING,
    Pending,
    PendingEntry,
    PriorityClass,
    admissible_in_order,
    order_key,
    order_pending,
    resolve_priority_class,
)
from tessera.core.queueing.quotas import (
    QUEUEING_STRATEGIES,
    Admission,
    QueueingStrategy,
    QueueSpec,
    QuotaLedger,
    QuotaNeed,
)
from tessera.core.queueing.resources import ANY_FLAVOR, Flavor, ResourceVector, canonical_flavor

__all__ = [
    "ANY_FLAVOR",
    "BEST_EFFORT",
    "BUILTIN_PRIORITY_CLASSES",
    "INFERENCE_CRITICAL",
    "QUEUEING_STRATEGIES",
    "TRAINING",
    "Admission",
    "Flavor",
    "Pending",
    "PendingEntry",
    "PriorityClass",
    "QueueSpec",
    "QueueUsage",
    "QueueingStrategy",
    "QuotaLedger",
    "QuotaNeed",
    "ResourceVector",
    "admissible_in_order",
    "canonical_flavor",
    "dominant_share",
    "drf_order",
    "entitlement",
    "order_key",
    "order_pending",
    "resolve_priority_class",
    "water_fill",
]
