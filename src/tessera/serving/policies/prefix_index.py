"""Capped least-recently-used maps for the affinity routers: prompt-prefix block hashes and sessions -> replica.

A router that sends a prompt to the replica which served its leading blocks last lets that replica reuse its
prefix cache (paged KV blocks of 16 tokens) instead of prefilling them again. ``request.prefix`` holds one hash per
leading 16-token block, each chained over the blocks before it, so a hit on block k means the replica saw the whole
prompt up to and including block k: the longest matched prefix is the last block found in the index.

Memory is bounded: a map never holds more than its ``max_entries``, evicting the least recently used entry first
(an ``OrderedDict`` in recency order, oldest first). Entries of replicas that are gone are dropped lazily, when a
look-up meets them, rather than by a sweep when a replica stops: the router only knows the replicas it is shown.

The maps are mutable state owned by the caller (one per model's router state); their methods update in place.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol


class _ReplicaLike(Protocol):
    @property
    def replica(self) -> int: ...

    @property
    def accepting(self) -> bool: ...


@dataclass(slots=True)
class CappedLru:
    """An int -> replica id map of at most ``max_entries`` entries, least recently used evicted first."""

    max_entries: int
    entries: OrderedDict[int, int] = field(default_factory=OrderedDict)

    def __post_init__(self) -> None:
        if self.max_entries < 1:
            raise ValueError(f"max_entries must be >= 1, got {self.max_entries}")

    def __len__(self) -> int:
        return len(self.entries)

    def get(self, key: int) -> int | None:
        """The replica recorded for ``key`` (no recency change: a look-up is not a use until it is routed)."""
        return self.entries.get(key)

    def put(self, key: int, replica: int) -> None:
        """Record ``key`` -> ``replica`` as the most recent entry, evicting the oldest ones beyond the cap."""
        entries = self.entries
        if key in entries:
            entries.move_to_end(key)
        entries[key] = replica
        while len(entries) > self.max_entries:
            entries.popitem(last=False)

    def forget(self, key: int) -> None:
        self.entries.pop(key, None)


def find_replica(replicas: Sequence[_ReplicaLike], replica: int) -> int:
    """Position of ``replica`` among ``replicas``, or -1 when it is absent (a linear scan: replicas are few)."""
    for position, view in enumerate(replicas):
        if view.replica == replica:
            return position
    return -1


@dataclass(slots=True)
class PrefixIndex:
    """Prompt-prefix block hash -> the replica that last served a prompt holding that prefix."""

    lru: CappedLru

    @classmethod
    def with_cap(cls, max_entries: int) -> PrefixIndex:
        return cls(CappedLru(max_entries))

    def __len__(self) -> int:
        return len(self.lru)

    def longest_match(self, prefix: Sequence[int], replicas: Sequence[_ReplicaLike]) -> tuple[int, int]:
        """(position in ``replicas``, matched blocks) of the accepting replica with the longest matched prefix, or
        (-1, 0) when none matches. Scans from the deepest block back, so a hit stops the scan; entries naming a
        replica that is no longer among ``replicas`` are forgotten on the way (lazy cleanup). A draining replica
        keeps its entries (it may come back) but is not chosen."""
        lru = self.lru
        for depth in range(len(prefix) - 1, -1, -1):
            block = prefix[depth]
            owner = lru.get(block)
            if owner is None:
                continue
            position = find_replica(replicas, owner)
            if position < 0:
                lru.forget(block)
            elif replicas[position].accepting:
                return position, depth + 1
        return -1, 0

    def record(self, prefix: Sequence[int], replica: int) -> None:
        """The routed request's blocks now live on ``replica``: all of them become its most recent entries.
        Recorded deepest block first, so that the shallow blocks (shared by more prompts) are evicted last."""
        entries, cap = self.lru.entries, self.lru.max_entries
        move_to_end, evict_oldest = entries.move_to_end, entries.popitem
        for depth in range(len(prefix) - 1, -1, -1):  # CappedLru.put inlined: this is the router's hot loop
            block = prefix[depth]
            if block in entries:
                move_to_end(block)
            elif len(entries) >= cap:
                evict_oldest(last=False)
            entries[block] = replica

    def forget_replica(self, replica: int) -> int:
        """Drop every entry of ``replica`` at once (a sweep, O(entries): for a caller that knows a replica is
        gone for good). Returns how many were dropped."""
        entries = self.lru.entries
        stale = [block for block, owner in entries.items() if owner == replica]
        for block in stale:
            del entries[block]
        return len(stale)
