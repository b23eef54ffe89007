"""Holding requests at the gateway until a replica of their model has room for them (late binding).

A request waits here while its model has no replica that may take it: none is ready yet (a model at zero, or
starting), every ready one is at its in-flight cap (``ModelRoute.replica_concurrency``), or the only ones left are
replicas that this very request found gone (``Held.avoid``). The gateway's dispatcher (``binding``) takes held
requests out most urgent first (class, then deadline, as ``InferenceRequest.priority_key`` orders them) and binds
each to a replica the moment one has room: ``pop_urgent``, then ``bind`` (or ``put_back`` when nothing may take
that one). A request waits until it is bound (``settle`` returns the binding), let go unbound (``release``: its
route changed, gone or failing; ``settle`` returns None and the caller looks again), its client goes away (its task
is cancelled: it leaves; a binding made for it just before is handed to ``abandoned``), or its expiry passes
(``HoldExpired``). The area is bounded per model: one request too many gets ``HoldOverflow`` (429).

Costs: ``add``, ``pop_urgent`` and ``bind`` are O(log held); withdrawn and expired entries leave the heaps lazily
(compacted once they are more than half of them). Call it on the event loop thread only.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from tessera.serving.policies.requests import InferenceRequest

T = TypeVar("T")
_Key = tuple[int, float, float, int]
_SLACK = 64  # dead heap entries tolerated beyond the live ones before a compaction


class HoldOverflow(Exception):
    def __init__(self, model: str, limit: int) -> None:
        super().__init__(f"model {model!r} has no replica with room and {limit} requests already wait for one")
        self.model = model


class HoldExpired(Exception):
    """The bounded wait ran out before a replica took the request (the message says how long it waited)."""


@dataclass(eq=False, slots=True)
class Held(Generic[T]):
    """One held request."""

    request: InferenceRequest
    avoid: frozenset[int]  # replica ids it must not be bound to (they were gone when it was sent there)
    since_s: float  # loop time it was held
    expires_s: float  # loop time it gets ``HoldExpired``
    future: asyncio.Future[T | None]


@dataclass(slots=True)
class _ModelHeld(Generic[T]):
    by_id: dict[int, Held[T]] = field(default_factory=dict)  # the live ones
    urgent: list[tuple[_Key, Held[T]]] = field(default_factory=list)  # heap by priority key (ends with the id)


class HoldArea(Generic[T]):
    """See the module docstring. ``abandoned(held, binding)``: a request bound and then cancelled before it could
    use its binding (its client left); the caller undoes what the binding cost."""

    def __init__(
        self, max_hold_s: float, max_held_per_model: int, abandoned: Callable[[Held[T], T], None] | None = None
    ) -> None:
        if max_hold_s <= 0:
            raise ValueError(f"max_hold_s must be > 0, got {max_hold_s}")
        if max_held_per_model < 1:
            raise ValueError(f"max_held_per_model must be >= 1, got {max_held_per_model}")
        self.max_hold_s = max_hold_s
        self.max_held_per_model = max_held_per_model
        self.abandoned = abandoned
        self._models: dict[str, _ModelHeld[T]] = {}
        self._expiries: list[tuple[float, int, Held[T]]] = []  # heap over all models
        self._seq = itertools.count()
        self._count = 0
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf

    def held(self, model: str) -> int:
        models = self._models.get(model)
        return len(models.by_id) if models is not None else 0

    def total(self) -> int:
        return self._count

    def models(self) -> list[str]:
        """The models that have requests held."""
        return list(self._models)

    # ------------------------------------------------------------------------------------------ a request's side
    def add(self, request: InferenceRequest, avoid: frozenset[int] = frozenset(), expires_s: float = 0.0) -> Held[T]:
        """Hold ``request`` until ``expires_s`` (loop time; 0: ``max_hold_s`` from now), or raise
        ``HoldOverflow``. Await ``settle`` with the result."""
        models = self._models.get(request.model)
        if models is None:
            models = self._models[request.model] = _ModelHeld()
        if len(models.by_id) >= self.max_held_per_model:
            raise HoldOverflow(request.model, self.max_held_per_model)
        loop = asyncio.get_running_loop()
        now = loop.time()
        held: Held[T] = Held(request, avoid, now, expires_s or now + self.max_hold_s, loop.create_future())
        models.by_id[request.id] = held
        heapq.heappush(models.urgent, (request.priority_key(), held))
        heapq.heappush(self._expiries, (held.expires_s, next(self._seq), held))
        self._count += 1
        self._arm(loop)
        return held

    async def settle(self, held: Held[T]) -> T | None:
        """The binding ``held`` was given, or None when it was let go unbound (see the module docstring)."""
        try:
            return await held.future
        except asyncio.CancelledError:
            future = held.future
            if future.done() and not future.cancelled() and future.exception() is None:
                bound = future.result()
                if bound is not None and self.abandoned is not None:
                    self.abandoned(held, bound)
            else:
                self._forget(held)
            raise

    async def wait(
        self, request: InferenceRequest, avoid: frozenset[int] = frozenset(), expires_s: float = 0.0
    ) -> T | None:
        """``add`` then ``settle``."""
        return await self.settle(self.add(request, avoid, expires_s))

    # -------------------------------------------------------------------------------------- the dispatcher's side
    def pop_urgent(self, model: str) -> Held[T] | None:
        """The most urgent request held for ``model``, taken out of the order (``bind`` it or ``put_back``)."""
        models = self._models.get(model)
        if models is None:
            return None
        urgent, live = models.urgent, models.by_id
        while urgent:
            _, held = heapq.heappop(urgent)
            if live.get(held.request.id) is held:
                return held
        return None

    def put_back(self, held: Held[T]) -> None:
        models = self._models.get(held.request.model)
        if models is not None and models.by_id.get(held.request.id) is held:
            heapq.heappush(models.urgent, (held.request.priority_key(), held))

    def bind(self, held: Held[T], binding: T) -> None:
        """``held`` goes, with ``binding`` (what ``settle`` returns to it)."""
        self._forget(held)
        if not held.future.done():
            held.future.set_result(binding)

    def release(self, model: str) -> int:
        """Let every request held for ``model`` go unbound, most urgent first; returns how many."""
        models = self._models.get(model)
        if models is None:
            return 0
        released = sorted(models.by_id.values(), key=lambda h: h.request.priority_key())
        for held in released:
            self._forget(held)
            if not held.future.done():
                held.future.set_result(None)
        return len(released)

    # ------------------------------------------------------------------------------------------------ internals
    def _forget(self, held: Held[T]) -> None:
        model = held.request.model
        models = self._models.get(model)
        if models is None or models.by_id.get(held.request.id) is not held:
            return
        del models.by_id[held.request.id]
        self._count -= 1
        if not models.by_id:
            del self._models[model]
        elif len(models.urgent) > 2 * len(models.by_id) + _SLACK:
            models.urgent = [(k, h) for k, h in models.urgent if models.by_id.get(h.request.id) is h]
            heapq.heapify(models.urgent)
        if len(self._expiries) > 2 * self._count + _SLACK:
            self._expiries = [e for e in self._expiries if self._live(e[2])]
            heapq.heapify(self._expiries)

    def _live(self, held: Held[T]) -> bool:
        models = self._models.get(held.request.model)
        return models is not None and models.by_id.get(held.request.id) is held

    def _arm(self, loop: asyncio.AbstractEventLoop) -> None:
        while self._expiries and not self._live(self._expiries[0][2]):
            heapq.heappop(self._expiries)
        at = self._expiries[0][0] if self._expiries else None
        if at is None or at >= self._timer_at:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = at
        self._timer = loop.call_at(at, self._expire)

    def _expire(self) -> None:
        loop = asyncio.get_running_loop()
        now = max(loop.time(), self._timer_at)  # the loop may wake a hair early: the expiry is due
        self._timer = None
        self._timer_at = math.inf
        while self._expiries and self._expiries[0][0] <= now:
            _, _, held = heapq.heappop(self._expiries)
            if not self._live(held):
                continue
            self._forget(held)
            request = held.request
            reason = (
                f"request {request.id} rejected: held {now - held.since_s:.1f} s (limit {self.max_hold_s:g} s)"
                f" with no replica of model {request.model!r} ready to take it"
            )
            if not held.future.done():
                held.future.set_exception(HoldExpired(reason))
        self._arm(loop)
