"""The capped LRU maps behind the affinity routers: cap, eviction order, longest match, lazy cleanup."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tessera.serving.policies.prefix_index import CappedLru, PrefixIndex
from tessera.serving.policies.router import ReplicaView


def _views(*replicas: int, draining: tuple[int, ...] = ()) -> list[ReplicaView]:
    return [ReplicaView(r, 0, 0, 0, 1.0, r not in draining) for r in replicas]


def test_lru_evicts_the_least_recently_put() -> None:
    lru = CappedLru(3)
    for key in (1, 2, 3):
        lru.put(key, key * 10)
    lru.put(1, 11)  # 1 is now the most recent
    lru.put(4, 40)
    assert list(lru.entries) == [3, 1, 4] and lru.get(1) == 11 and lru.get(2) is None
    lru.get(3)  # a look-up is not a use
    lru.put(5, 50)
    assert list(lru.entries) == [1, 4, 5]


def test_lru_rejects_a_zero_cap() -> None:
    with pytest.raises(ValueError, match="max_entries"):
        CappedLru(0)


def test_record_keeps_shallow_blocks_longest() -> None:
    index = PrefixIndex.with_cap(3)
    index.record((1, 2, 3, 4), 7)
    assert list(index.lru.entries) == [3, 2, 1]  # the deepest block (4) was evicted first


def test_longest_match_prefers_the_deepest_hit() -> None:
    index = PrefixIndex.with_cap(100)
    index.record((1, 2), 0)
    index.record((1, 2, 3, 4), 1)
    index.record((1, 5), 2)  # replica 2 took over block 1
    assert index.longest_match((1, 2, 3, 4, 9), _views(0, 1, 2)) == (1, 4)
    assert index.longest_match((1, 5, 6), _views(0, 1, 2)) == (2, 2)
    assert index.longest_match((8, 9), _views(0, 1, 2)) == (-1, 0)
    assert index.longest_match((), _views(0, 1, 2)) == (-1, 0)


def test_longest_match_skips_draining_and_forgets_gone_replicas() -> None:
    index = PrefixIndex.with_cap(100)
    index.record((1, 2), 0)
    index.record((1, 2, 3), 2)  # replica 2 now owns 1, 2, 3
    index.record((1, 2, 3, 4, 5), 1)  # replica 1 owns the whole chain
    index.record((1, 2, 3), 2)  # ... until 2 serves the shorter prompt again: 1 keeps blocks 4 and 5
    views = _views(0, 2, draining=(2,))  # replica 1 is gone, 2 is draining
    assert index.longest_match((1, 2, 3, 4, 5), views) == (-1, 0)
    assert index.lru.get(5) is None and index.lru.get(4) is None  # gone replica's blocks forgotten on the way
    assert index.lru.get(3) == 2  # the draining replica keeps its entries
    assert index.longest_match((1, 2, 3, 4, 5), _views(0, 2)) == (1, 3)


def test_forget_replica_sweeps_its_entries() -> None:
    index = PrefixIndex.with_cap(100)
    index.record((1, 2), 0)
    index.record((3, 4, 5), 1)
    assert index.forget_replica(1) == 3
    assert set(index.lru.entries.values()) == {0} and len(index) == 2


@given(
    cap=st.integers(1, 20),
    puts=st.lists(st.tuples(st.integers(0, 50), st.integers(0, 5)), max_size=200),
)
def test_lru_never_exceeds_its_cap_and_keeps_the_most_recent(cap: int, puts: list[tuple[int, int]]) -> None:
    lru = CappedLru(cap)
    for key, replica in puts:
        lru.put(key, replica)
        assert len(lru) <= cap
        assert lru.get(key) == replica
    recent: list[int] = []
    for key, _ in reversed(puts):
        if key not in recent:
            recent.append(key)
    assert list(lru.entries) == recent[:cap][::-1]
