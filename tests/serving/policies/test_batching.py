"""Dynamic batching in virtual time: size and wait triggers; every item once, in order, never over the bounds."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tessera.serving.policies.batching import DynamicBatcherConfig, DynamicBatcherState, add, poll


def test_a_full_batch_leaves_at_once() -> None:
    state: DynamicBatcherState[str] = DynamicBatcherState(DynamicBatcherConfig(max_batch_size=3, max_wait_s=1.0))
    for name in "abcd":
        state = add(state, name, 0.0)
    batch, due, state = poll(state, 0.0)
    assert batch == ["a", "b", "c"] and due == 1.0
    assert poll(state, 0.5)[:2] == (None, 1.0)
    batch, due, state = poll(state, 1.0)
    assert batch == ["d"] and due is None and len(state) == 0


def test_the_oldest_item_waits_at_most_max_wait() -> None:
    state: DynamicBatcherState[int] = DynamicBatcherState(DynamicBatcherConfig(max_batch_size=10, max_wait_s=0.05))
    state = add(state, 1, 1.00)
    state = add(state, 2, 1.03)
    batch, due, state = poll(state, 1.04)
    assert batch is None and due == pytest.approx(1.05)
    batch, due, state = poll(state, 1.05)
    assert batch == [1, 2] and due is None
    assert poll(state, 9.0)[:2] == (None, None)


def test_a_backlog_is_released_one_full_batch_per_poll() -> None:
    state: DynamicBatcherState[int] = DynamicBatcherState(DynamicBatcherConfig(max_batch_size=2, max_wait_s=5.0))
    for i in range(5):
        state = add(state, i, 0.0)
    batch, due, state = poll(state, 0.0)
    assert batch == [0, 1] and due == 0.0  # another full batch is due now
    batch, due, state = poll(state, 0.0)
    assert batch == [2, 3] and due == 5.0


def test_bad_config_and_time_order() -> None:
    with pytest.raises(ValueError, match="max_batch_size"):
        DynamicBatcherConfig(max_batch_size=0, max_wait_s=1.0)
    state: DynamicBatcherState[int] = DynamicBatcherState(DynamicBatcherConfig(2, 1.0))
    add(state, 1, 5.0)
    with pytest.raises(ValueError, match="back in time"):
        add(state, 2, 4.0)


@given(
    size=st.integers(1, 6),
    wait=st.floats(0.0, 2.0),
    gaps=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=50),
)
def test_polled_at_its_deadlines_every_item_leaves_once_in_order_within_bounds(
    size: int, wait: float, gaps: list[float]
) -> None:
    """An event-driven caller: it polls after each arrival and at every deadline poll returns."""
    state: DynamicBatcherState[int] = DynamicBatcherState(DynamicBatcherConfig(size, wait))
    arrivals: list[float] = []
    released: list[int] = []
    now = 0.0
    waited_s: list[float] = []
    due: float | None = None

    def drain(at: float) -> float | None:
        nonlocal state
        while True:
            batch, next_due, state = poll(state, at)
            if batch is None:
                return next_due
            assert 1 <= len(batch) <= size
            released.extend(batch)
            waited_s.extend(at - arrivals[i] for i in batch)
            if next_due is None or next_due > at:
                return next_due

    for i, gap in enumerate(gaps):
        now += gap
        while due is not None and due <= now:  # deadlines that fall before this arrival
            due = drain(due)
        arrivals.append(now)
        state = add(state, i, now)
        due = drain(now)
    while due is not None:
        due = drain(due)
    assert released == list(range(len(gaps)))  # each exactly once, in arrival order
    assert max(waited_s) <= wait + 1e-9
