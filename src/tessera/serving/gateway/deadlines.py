"""Deadlines of many tasks on one recurring timer (the gateway's upstream: a replica's first answer, the gap
between the chunks of a streamed one)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

_T = TypeVar("_T")


class Deadlines:
    """Deadlines of many tasks on one recurring timer: a task still registered when a check finds it past its
    deadline is cancelled (checks every ``tick_s``, so up to that late). An ``asyncio.timeout`` per exchange arms
    and disarms a loop timer per request, about 3% of the gateway's CPU at 1,000 req/s; the timeouts here are
    seconds to minutes long, so a coarse check is enough."""

    def __init__(self, tick_s: float) -> None:
        self.tick_s = tick_s
        self._due: dict[asyncio.Task[object], float] = {}
        self._late: set[asyncio.Task[object]] = set()
        self._timer: asyncio.TimerHandle | None = None

    def add(self, task: asyncio.Task[object], due: float, loop: asyncio.AbstractEventLoop) -> None:
        self._due[task] = due
        if self._timer is None:
            self._timer = loop.call_later(self.tick_s, self._check, loop)

    def remove(self, task: asyncio.Task[object]) -> bool:
        """Unregister ``task``; True when it was cancelled for being late."""
        self._due.pop(task, None)
        if task in self._late:
            self._late.discard(task)
            return True
        return False

    def _check(self, loop: asyncio.AbstractEventLoop) -> None:
        self._timer = None
        now = loop.time()
        for task, due in list(self._due.items()):
            if due <= now:
                del self._due[task]
                self._late.add(task)
                task.cancel()
        if self._due:
            self._timer = loop.call_later(self.tick_s, self._check, loop)

    async def within(self, awaitable: Awaitable[_T], limit_s: float) -> _T:
        """``await awaitable``, raising ``TimeoutError`` once ``limit_s`` has passed; any other cancel (the client
        left) goes through as it is."""
        task = asyncio.current_task()
        assert task is not None
        loop = asyncio.get_running_loop()
        self.add(task, loop.time() + limit_s, loop)
        try:
            return await awaitable
        except asyncio.CancelledError:
            if self.remove(task) and task.uncancel() == 0:
                raise TimeoutError from None
            raise
        finally:
            self.remove(task)
