"""Dynamic batching for non-autoregressive models (embeddings, rerankers, classifiers): one forward pass serves a
whole batch, so items wait a little to share it.

A batch is released when ``max_batch_size`` items are pending, or when the oldest pending item has waited
``max_wait_s`` (then with everything pending, up to the size bound). Items leave in arrival order. ``poll``
returns at most one batch per call, and the time of the next release (``next_deadline_s``: ``now_s`` again when a
full batch is still pending), so an event-driven caller schedules a poll then and a ticking one loops until
``poll`` returns no batch. Polled at each ``next_deadline_s``, no item waits beyond ``max_wait_s``.

The state is the caller's; ``add`` and ``poll`` update it in place and return it.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Generic, TypeVar

Item = TypeVar("Item")


@dataclass(frozen=True, slots=True)
class DynamicBatcherConfig:
    max_batch_size: int
    max_wait_s: float

    def __post_init__(self) -> None:
        if self.max_batch_size < 1 or self.max_wait_s < 0:
            raise ValueError(f"dynamic batching needs max_batch_size >= 1 and max_wait_s >= 0: {self}")


@dataclass(slots=True)
class DynamicBatcherState(Generic[Item]):
    config: DynamicBatcherConfig
    items: deque[Item] = field(default_factory=deque)  # pending, oldest first
    added_s: deque[float] = field(default_factory=deque)  # when each pending item was added (parallel to items)

    def __len__(self) -> int:
        return len(self.items)


def add(state: DynamicBatcherState[Item], item: Item, now_s: float) -> DynamicBatcherState[Item]:
    """Queue ``item`` at ``now_s`` (non-decreasing across calls)."""
    if state.added_s and now_s < state.added_s[-1]:
        raise ValueError(f"add: now_s went back in time ({now_s} < {state.added_s[-1]})")
    state.items.append(item)
    state.added_s.append(now_s)
    return state


def _next_deadline(state: DynamicBatcherState[Item], now_s: float) -> float | None:
    if not state.items:
        return None
    if len(state.items) >= state.config.max_batch_size:
        return now_s
    return state.added_s[0] + state.config.max_wait_s


def poll(
    state: DynamicBatcherState[Item], now_s: float
) -> tuple[list[Item] | None, float | None, DynamicBatcherState[Item]]:
    """(the batch released now or None, when the next one is due or None when nothing is pending, state)."""
    config = state.config
    pending = len(state.items)
    if pending == 0:
        return None, None, state
    if pending < config.max_batch_size and now_s < state.added_s[0] + config.max_wait_s:
        return None, state.added_s[0] + config.max_wait_s, state
    size = min(pending, config.max_batch_size)
    popleft_item, popleft_time = state.items.popleft, state.added_s.popleft
    batch = [popleft_item() for _ in range(size)]
    for _ in range(size):
        popleft_time()
    return batch, _next_deadline(state, now_s), state
