"""Resource vectors and flavors: the units that queue quotas, fair share and preemption count in.

A ``ResourceVector`` is an amount of (GPU milli, CPU milli, host memory MiB). Quotas are vectors per *flavor*: a
flavor is a canonical GPU model name from the catalog (``"A100-80GB"``) or ``"*"`` meaning any model. Vectors are
compared component by component, so ``<=`` is a partial order: ``not a <= b`` does not mean ``b <= a``.

Used by ``queueing.quotas`` (the quota ledger), ``queueing.fairshare`` (DRF) and ``core.preemption``.
"""

from __future__ import annotations

from dataclasses import dataclass

from tessera.core.catalog import resolve_model
from tessera.core.errors import InvalidRequestError, UnknownGpuModelError

Flavor = str  # a canonical GPU model name, or ANY_FLAVOR
ANY_FLAVOR: Flavor = "*"


@dataclass(frozen=True, slots=True)
class ResourceVector:
    gpu_milli: int = 0  # thousandths of a GPU (1000 = one GPU)
    cpu_milli: int = 0  # thousandths of a CPU core
    mem_mib: int = 0  # host memory

    @staticmethod
    def zero() -> ResourceVector:
        return _ZERO

    def __add__(self, other: ResourceVector) -> ResourceVector:
        return ResourceVector(
            self.gpu_milli + other.gpu_milli, self.cpu_milli + other.cpu_milli, self.mem_mib + other.mem_mib
        )

    def __sub__(self, other: ResourceVector) -> ResourceVector:
        """Difference; components may become negative (use ``positive_part`` to clamp)."""
        return ResourceVector(
            self.gpu_milli - other.gpu_milli, self.cpu_milli - other.cpu_milli, self.mem_mib - other.mem_mib
        )

    def __le__(self, other: ResourceVector) -> bool:
        """Every component at most the other's (a partial order)."""
        return self.gpu_milli <= other.gpu_milli and self.cpu_milli <= other.cpu_milli and self.mem_mib <= other.mem_mib

    def __ge__(self, other: ResourceVector) -> bool:
        return other <= self

    def minimum(self, other: ResourceVector) -> ResourceVector:
        """Component-wise minimum."""
        return ResourceVector(
            min(self.gpu_milli, other.gpu_milli), min(self.cpu_milli, other.cpu_milli), min(self.mem_mib, other.mem_mib)
        )

    def positive_part(self) -> ResourceVector:
        """Negative components set to zero."""
        return ResourceVector(max(self.gpu_milli, 0), max(self.cpu_milli, 0), max(self.mem_mib, 0))

    def is_zero(self) -> bool:
        return self.gpu_milli == 0 and self.cpu_milli == 0 and self.mem_mib == 0

    def is_non_negative(self) -> bool:
        return self.gpu_milli >= 0 and self.cpu_milli >= 0 and self.mem_mib >= 0

    def dominant_share(self, capacity: ResourceVector) -> float:
        """The largest fraction of ``capacity`` this amount takes over all resources (DRF's dominant share).

        A resource with zero capacity is ignored; a zero vector has share 0.
        """
        shares = [
            used / cap
            for used, cap in (
                (self.gpu_milli, capacity.gpu_milli),
                (self.cpu_milli, capacity.cpu_milli),
                (self.mem_mib, capacity.mem_mib),
            )
            if cap > 0
        ]
        return max(shares, default=0.0)


_ZERO = ResourceVector()


def canonical_flavor(name: str, field: str = "flavor") -> Flavor:
    """``"*"`` or the catalog's canonical name for the GPU model ``name``; an unknown model names ``field``."""
    if name.strip() == ANY_FLAVOR:
        return ANY_FLAVOR
    try:
        return resolve_model(name).name
    except UnknownGpuModelError as err:
        raise InvalidRequestError(field, err.message) from err
