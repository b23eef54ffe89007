"""Holding requests for a model with no ready replica: the part-1 ``HoldQueue`` on the gateway's event loop.

A request for a deployed model that has no ready replica waits here (never a 404 or 503) until a replica is ready
(``release``, called when the registry says the model's replicas changed), its client goes away (``withdraw``), or
it has waited ``max_hold_s`` (``HoldExpired``). The queue is bounded per model: one request too many gets
``HoldOverflow`` (the gateway answers 429 with ``Retry-After``). Released requests go in priority order (class,
then deadline), as the part-1 ``release`` returns them.
"""

from __future__ import annotations

import asyncio
import math

from tessera.serving.policies.admission import HoldQueue, expire, held_count, hold, next_expiry_s, release, withdraw
from tessera.serving.policies.requests import InferenceRequest


class HoldOverflow(Exception):
    def __init__(self, model: str, limit: int) -> None:
        super().__init__(f"model {model!r} is starting and {limit} requests already wait for it")
        self.model = model


class HoldExpired(Exception):
    """The bounded wait ran out before a replica was ready (the message is the part-1 queue's reason)."""


class HoldArea:
    """See the module docstring. Call it on the event loop thread only."""

    def __init__(self, max_hold_s: float, max_held_per_model: int) -> None:
        if max_held_per_model < 1:
            raise ValueError(f"max_held_per_model must be >= 1, got {max_held_per_model}")
        self.queue = HoldQueue(max_hold_s=max_hold_s)
        self.max_held_per_model = max_held_per_model
        self._waiters: dict[int, asyncio.Future[None]] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf

    def held(self, model: str) -> int:
        return held_count(self.queue, model)

    async def wait(self, request: InferenceRequest) -> None:
        """Hold ``request`` until its model has a replica (returns), or raise ``HoldOverflow``/``HoldExpired``.
        Cancelling the waiting task withdraws it."""
        if held_count(self.queue, request.model) >= self.max_held_per_model:
            raise HoldOverflow(request.model, self.max_held_per_model)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        self._waiters[request.id] = future
        hold(self.queue, request, loop.time())
        self._arm(loop)
        try:
            await future
        except asyncio.CancelledError:
            withdraw(self.queue, request.model, request.id)
            raise
        finally:
            self._waiters.pop(request.id, None)

    def release(self, model: str) -> int:
        """Let every request held for ``model`` go (a replica is ready); returns how many."""
        released, _ = release(self.queue, model)
        for request in released:
            future = self._waiters.get(request.id)
            if future is not None and not future.done():
                future.set_result(None)
        return len(released)

    def _arm(self, loop: asyncio.AbstractEventLoop) -> None:
        at = next_expiry_s(self.queue)
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
        rejected, _ = expire(self.queue, now)
        for request, reason in rejected:
            future = self._waiters.get(request.id)
            if future is not None and not future.done():
                future.set_exception(HoldExpired(reason))
        self._arm(loop)
