"""Per-node model cache: where a model's weights are, how long until a replica of it can serve, what to evict.

Three tiers:
- HOT: weights on a GPU and an engine running (the caller knows: a replica exists); ready now.
- WARM: weights in the node's host memory, the engine asleep or restartable from a warm state (vLLM sleep mode
  level 1 keeps the weights in CPU memory): ready after a host -> GPU copy and a wake.
- COLD: weights on the node's local disk: ready after an NVMe -> host -> GPU load and a full engine start.

``ready_time_s`` = eviction (copying victims GPU -> host) + weight transfer at the tier's bandwidth + engine start.
The defaults in ``CacheTimings`` are round figures in the spirit of what is published: vLLM's sleep mode wakes in
0.3-0.8 s for small models and 3-6 s for large ones; a plain reload of a 70B model takes tens of seconds (baselines
of OPT-30B 34 s, LLaMA-2-70B 84 s); ServerlessLLM-style loaders stream checkpoints from NVMe at several GB/s
(Qwen3-32B in 1.3-3.2 s over a RAID). They are overridable: a team calibrates them on its own nodes.

The host-memory cache (``NodeCacheState``) is mutable state owned by the caller; its functions update it in place
and return it with their decision. The GPU eviction choice is a pure function of the hot models.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field

GB = 1e9  # bandwidths in decimal GB/s, as links and disks are rated


class Tier(enum.Enum):
    HOT = "hot"
    WARM = "warm"
    COLD = "cold"


@dataclass(frozen=True, slots=True)
class CacheTimings:
    """Bandwidths (GB/s, 1e9 bytes) and fixed times (s) that make up a ready time.

    - ``host_to_gpu_gb_per_s`` 25: effective PCIe Gen4/Gen5 x16 host -> GPU copy per GPU (pinned memory reaches
      ~25 GB/s of Gen4's 32); a tensor-parallel replica loads its shards in parallel, one link per GPU.
    - ``gpu_to_host_gb_per_s`` 25: the same link the other way, to offload an evicted model into host memory.
    - ``nvme_to_host_gb_per_s`` 5: one local NVMe SSD (Gen4 sequential reads ~5-7 GB/s), shared by all the GPUs of
      the node; a cold load streams disk -> host -> GPU in chunks, so the slower stage bounds it.
    - ``engine_cold_start_s`` 20: a fresh engine process: runtime import, CUDA context, memory profiling, CUDA graph
      capture (vLLM's start-up is tens of seconds with graph capture).
    - ``engine_wake_s`` 0.5: what waking an asleep engine (or a warm start from a snapshot) costs beyond copying
      the weights back: measured sleep-mode wakes of small models take 0.3-0.8 s *including* their ~15 GB copy
      (0.5 s at 25 GB/s), so the fixed part is a few tenths of a second.
    """

    host_to_gpu_gb_per_s: float = 25.0
    gpu_to_host_gb_per_s: float = 25.0
    nvme_to_host_gb_per_s: float = 5.0
    engine_cold_start_s: float = 20.0
    engine_wake_s: float = 0.5

    def __post_init__(self) -> None:
        for name in ("host_to_gpu_gb_per_s", "gpu_to_host_gb_per_s", "nvme_to_host_gb_per_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.engine_cold_start_s < 0 or self.engine_wake_s < 0:
            raise ValueError(f"engine start times must be >= 0: {self}")


DEFAULT_TIMINGS = CacheTimings()


def ready_time_s(
    model_bytes: int,
    tier: Tier,
    timings: CacheTimings = DEFAULT_TIMINGS,
    gpus: int = 1,
    evict_bytes: int = 0,
) -> float:
    """Seconds until a replica of a model of ``model_bytes`` (all shards) can serve, starting from ``tier``, on
    ``gpus`` GPUs (its shards load in parallel, one PCIe link each). ``evict_bytes``: bytes first copied GPU ->
    host to make room (pass 0 when the victims are simply dropped, their weights being on disk anyway); the
    offload uses the same GPUs' links. HOT is 0: the replica already serves."""
    if model_bytes < 0 or evict_bytes < 0 or gpus < 1:
        raise ValueError(f"ready_time_s: bytes must be >= 0 and gpus >= 1 (got {model_bytes}, {evict_bytes}, {gpus})")
    if tier is Tier.HOT:
        return 0.0
    evict_s = evict_bytes / (timings.gpu_to_host_gb_per_s * GB * gpus)
    to_gpu_s = model_bytes / (timings.host_to_gpu_gb_per_s * GB * gpus)
    if tier is Tier.WARM:
        return evict_s + to_gpu_s + timings.engine_wake_s
    from_disk_s = model_bytes / (timings.nvme_to_host_gb_per_s * GB)
    return evict_s + max(from_disk_s, to_gpu_s) + timings.engine_cold_start_s


# ------------------------------------------------------------------------------------------- host memory (WARM)


@dataclass(slots=True)
class WarmEntry:
    bytes: int
    last_used_s: float
    priority: int  # higher = more important to keep


@dataclass(slots=True)
class NodeCacheState:
    """The models a node keeps in host memory (WARM), within ``host_capacity_bytes``; owned by the caller."""

    host_capacity_bytes: int
    warm: dict[str, WarmEntry] = field(default_factory=dict)
    used_bytes: int = 0

    def __post_init__(self) -> None:
        if self.host_capacity_bytes < 0:
            raise ValueError(f"host_capacity_bytes must be >= 0, got {self.host_capacity_bytes}")
        self.used_bytes = sum(entry.bytes for entry in self.warm.values())


def tier_of(state: NodeCacheState, model: str) -> Tier:
    """WARM if the node holds ``model`` in host memory, else COLD (HOT is the caller's: a replica exists)."""
    return Tier.WARM if model in state.warm else Tier.COLD


def _warm_eviction_order(item: tuple[str, WarmEntry]) -> tuple[int, float, str]:
    name, entry = item
    return (entry.priority, entry.last_used_s, name)


def admit_warm(
    state: NodeCacheState, model: str, model_bytes: int, priority: int, now_s: float
) -> tuple[list[str], NodeCacheState]:
    """Keep ``model`` in host memory, evicting others by priority (lowest first), then least recently used.

    Only models of priority <= ``priority`` may be evicted for it: a low-priority model never pushes out a more
    important one. All or nothing: when not enough can be freed (or the model is bigger than the whole host
    cache) nothing is evicted and the model is not kept. Returns (evicted models, state); updates in place."""
    if model_bytes < 0:
        raise ValueError(f"model {model!r}: bytes must be >= 0, got {model_bytes}")
    present = state.warm.get(model)
    if present is not None:
        state.used_bytes -= present.bytes  # re-admitted, maybe at a new size or priority
        del state.warm[model]
    free = state.host_capacity_bytes - state.used_bytes
    victims: list[str] = []
    if model_bytes > free:
        for name, entry in sorted(state.warm.items(), key=_warm_eviction_order):
            if entry.priority > priority:
                break  # sorted by priority: nothing further may go
            victims.append(name)
            free += entry.bytes
            if free >= model_bytes:
                break
        if free < model_bytes:
            return [], state  # cannot be kept; the old copy (if any) is dropped with it
        for name in victims:
            state.used_bytes -= state.warm.pop(name).bytes
    state.warm[model] = WarmEntry(model_bytes, now_s, priority)
    state.used_bytes += model_bytes
    return victims, state


def touch(state: NodeCacheState, model: str, now_s: float) -> NodeCacheState:
    """Mark a warm model used at ``now_s`` (no-op when it is not warm)."""
    entry = state.warm.get(model)
    if entry is not None and now_s > entry.last_used_s:
        entry.last_used_s = now_s
    return state


def drop_warm(state: NodeCacheState, model: str) -> NodeCacheState:
    """Forget a warm copy (e.g. the caller frees host memory, or moved the weights to a GPU without a copy)."""
    entry = state.warm.pop(model, None)
    if entry is not None:
        state.used_bytes -= entry.bytes
    return state


# ----------------------------------------------------------------------------------------------- GPU (HOT)


@dataclass(frozen=True, slots=True)
class HotModel:
    """A replica holding GPU memory, as the eviction choice sees it."""

    key: int  # replica id
    model: str
    bytes: int  # GPU memory it would free (weights + KV reserve)
    priority: int  # higher = more important
    last_used_s: float
    idle: bool  # no request queued or running


def _gpu_eviction_order(hot: HotModel) -> tuple[int, bool, float, int]:
    return (hot.priority, not hot.idle, hot.last_used_s, hot.key)


def choose_gpu_victims(
    hot: Sequence[HotModel], need_bytes: int, free_bytes: int, for_priority: int
) -> list[int] | None:
    """Replicas to evict so that ``need_bytes`` fit next to ``free_bytes``, or None when not enough can be freed.

    Candidates: idle replicas of any priority (an idle replica only caches its model), and replicas of strictly
    lower priority than ``for_priority`` even when busy (preemption: their requests are requeued by the caller).
    Order: lowest priority first, idle before busy, then least recently used, then key. Taken in that order until
    enough is free; [] when it already fits. An equal- or higher-priority busy replica is never chosen."""
    if free_bytes >= need_bytes:
        return []
    candidates = sorted((h for h in hot if h.idle or h.priority < for_priority), key=_gpu_eviction_order)
    victims: list[int] = []
    freed = free_bytes
    for candidate in candidates:
        victims.append(candidate.key)
        freed += candidate.bytes
        if freed >= need_bytes:
            return victims
    return None
