"""Admission by SLO class, the priority order of service, and holding requests for a model scaled to zero.

- ``admit``: only ``batch`` is ever shed, and only under overload (the rule is in ``AdmissionConfig``);
  ``interactive`` and ``standard`` are always admitted, if need be held until a replica is ready.
- ``RequestHeap``: pops requests in ``InferenceRequest.priority_key`` order (class, then earliest deadline, then
  arrival, then id): a lower class is never served while a higher one waits, and a class is earliest deadline first.
- ``HoldQueue``: requests of a model with no ready replica wait (never dropped) until a replica is ready
  (``release``) or ``max_hold_s`` has passed (``expire``: rejected with a reason that says so), or its client goes
  away (``withdraw``).

All state is the caller's; functions update it in place and return it with their decision.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, field

from tessera.serving.policies.requests import DEFAULT_SLO_TARGETS, InferenceRequest, SloClass


@dataclass(frozen=True, slots=True)
class AdmissionSignals:
    """The load of the request's model when it arrives."""

    ready_replicas: int
    queued_requests: int  # waiting in the replicas' engines and held, all classes
    est_wait_s: float  # estimated wait before this request's first token (the caller's estimate, e.g. queued
    # prefill tokens over the replicas' prefill rate)


@dataclass(frozen=True, slots=True)
class AdmissionConfig:
    """Shed a batch request when it would wait longer than ``batch_max_wait_s`` (default: the batch class's TTFT
    target, which it would miss anyway) or when more than ``batch_max_queued_per_replica`` requests wait per ready
    replica (counting at least one replica, so a model at zero with a long hold queue sheds batch too)."""

    batch_max_wait_s: float = DEFAULT_SLO_TARGETS[SloClass.BATCH].ttft_s
    batch_max_queued_per_replica: float = 64.0

    def __post_init__(self) -> None:
        if self.batch_max_wait_s <= 0 or self.batch_max_queued_per_replica <= 0:
            raise ValueError(f"admission bounds must be > 0: {self}")


@dataclass(frozen=True, slots=True)
class Admit:
    pass


@dataclass(frozen=True, slots=True)
class Shed:
    reason: str


ADMIT = Admit()


def admit(request: InferenceRequest, load: AdmissionSignals, config: AdmissionConfig) -> Admit | Shed:
    """Admit, or shed a batch request under overload (see ``AdmissionConfig``). Never sheds another class."""
    if request.slo is not SloClass.BATCH:
        return ADMIT
    if load.est_wait_s > config.batch_max_wait_s:
        return Shed(
            f"batch request {request.id} shed: estimated wait {load.est_wait_s:.1f} s > {config.batch_max_wait_s:g} s"
        )
    per_replica = load.queued_requests / max(1, load.ready_replicas)
    if per_replica > config.batch_max_queued_per_replica:
        return Shed(
            f"batch request {request.id} shed: {per_replica:.1f} queued per ready replica"
            f" > {config.batch_max_queued_per_replica:g}"
        )
    return ADMIT


# ------------------------------------------------------------------------------------------- order of service


_Key = tuple[int, float, float, int]


@dataclass(slots=True)
class RequestHeap:
    """A binary heap of requests in ``priority_key`` order (the key is unique: it ends with the request id)."""

    entries: list[tuple[_Key, InferenceRequest]] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.entries)

    def push(self, request: InferenceRequest) -> None:
        heapq.heappush(self.entries, (request.priority_key(), request))

    def peek(self) -> InferenceRequest | None:
        return self.entries[0][1] if self.entries else None

    def pop(self) -> InferenceRequest | None:
        return heapq.heappop(self.entries)[1] if self.entries else None


# --------------------------------------------------------------------------------------------- hold from zero


@dataclass(slots=True)
class HoldQueue:
    """Requests held per model while it has no ready replica, oldest first, each with the time it was held."""

    max_hold_s: float = 120.0
    held: dict[str, deque[tuple[float, InferenceRequest]]] = field(default_factory=dict)
    count: int = 0

    def __post_init__(self) -> None:
        if self.max_hold_s <= 0:
            raise ValueError(f"max_hold_s must be > 0, got {self.max_hold_s}")


def hold(state: HoldQueue, request: InferenceRequest, now_s: float) -> HoldQueue:
    """Hold ``request`` from ``now_s`` (calls for one model come in non-decreasing ``now_s``)."""
    queue = state.held.get(request.model)
    if queue is None:
        queue = state.held[request.model] = deque()
    elif queue and now_s < queue[-1][0]:
        raise ValueError(f"hold: now_s went back in time for model {request.model!r} ({now_s} < {queue[-1][0]})")
    queue.append((now_s, request))
    state.count += 1
    return state


def held_count(state: HoldQueue, model: str) -> int:
    queue = state.held.get(model)
    return len(queue) if queue is not None else 0


def release(state: HoldQueue, model: str) -> tuple[list[InferenceRequest], HoldQueue]:
    """All of ``model``'s held requests, in priority order, now that a replica is ready."""
    queue = state.held.pop(model, None)
    if not queue:
        return [], state
    state.count -= len(queue)
    return sorted((request for _, request in queue), key=InferenceRequest.priority_key), state


def withdraw(state: HoldQueue, model: str, request_id: int) -> tuple[bool, HoldQueue]:
    """Take request ``request_id`` out of ``model``'s held requests (its client went away); whether it was held.
    O(held requests of the model)."""
    queue = state.held.get(model)
    if not queue:
        return False, state
    for position, (_, request) in enumerate(queue):
        if request.id == request_id:
            del queue[position]
            state.count -= 1
            if not queue:
                del state.held[model]
            return True, state
    return False, state


def expire(state: HoldQueue, now_s: float) -> tuple[list[tuple[InferenceRequest, str]], HoldQueue]:
    """Reject the requests held for ``max_hold_s`` or more by ``now_s``, each with its reason, oldest first per
    model. O(models + expired)."""
    rejected: list[tuple[InferenceRequest, str]] = []
    deadline = now_s - state.max_hold_s
    for model, queue in list(state.held.items()):
        while queue and queue[0][0] <= deadline:
            since, request = queue.popleft()
            reason = (
                f"request {request.id} rejected: held {now_s - since:.1f} s (limit {state.max_hold_s:g} s)"
                f" with no ready replica of model {model!r}"
            )
            rejected.append((request, reason))
        if not queue:
            del state.held[model]
    state.count -= len(rejected)
    return rejected, state


def next_expiry_s(state: HoldQueue) -> float | None:
    """When the next held request expires (for an event-driven caller), or None when nothing is held."""
    fronts = [queue[0][0] for queue in state.held.values() if queue]
    return min(fronts) + state.max_hold_s if fronts else None
