"""Per-queue accounting of the timeline simulator: received versus entitled GPU, and Jain's fairness index."""

from __future__ import annotations

from collections.abc import Sequence

from tessera.core.cluster import ClusterState
from tessera.core.queueing import QueueSpec, ResourceVector, entitlement


def jain_index(values: Sequence[float]) -> float:
    """Jain's fairness index ``(sum x)^2 / (n * sum x^2)``: 1.0 when all are equal (and for no values)."""
    squares = sum(x * x for x in values)
    if not values or squares == 0:
        return 1.0
    return sum(values) ** 2 / (len(values) * squares)


class QueueAccounts:
    """Per queue, time-weighted over its busy periods: GPU milli received and GPU milli it was entitled to."""

    def __init__(self, queues: tuple[QueueSpec, ...], state: ClusterState) -> None:
        self.queues = queues
        self.capacity = ResourceVector(state.gpu_capacity_milli)
        self.demand_milli = {q.name: 0 for q in queues}  # pending + running
        self.received_milli = {q.name: 0 for q in queues}  # running
        self.received_integral = {q.name: 0.0 for q in queues}
        self.entitled_integral = {q.name: 0.0 for q in queues}

    def advance(self, dt_s: float) -> None:
        if dt_s <= 0 or not any(self.demand_milli.values()):
            return
        demands = {name: ResourceVector(milli) for name, milli in self.demand_milli.items()}
        entitled = entitlement(self.queues, self.capacity, demands)
        for name, milli in self.demand_milli.items():
            if milli > 0:
                self.received_integral[name] += self.received_milli[name] * dt_s
                self.entitled_integral[name] += entitled[name] * dt_s

    def shares(self) -> dict[str, float]:
        """received / entitled per queue that ever had demand."""
        return {
            name: self.received_integral[name] / entitled
            for name, entitled in self.entitled_integral.items()
            if entitled > 0
        }
