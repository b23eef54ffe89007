"""Model cache: ready times per tier, host-memory admission (priority then LRU, capacity), GPU victims."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tessera.serving.policies.model_cache import (
    GB,
    CacheTimings,
    HotModel,
    NodeCacheState,
    Tier,
    admit_warm,
    choose_gpu_victims,
    drop_warm,
    ready_time_s,
    tier_of,
    touch,
)

TIMINGS = CacheTimings(
    host_to_gpu_gb_per_s=20.0,
    gpu_to_host_gb_per_s=10.0,
    nvme_to_host_gb_per_s=4.0,
    engine_cold_start_s=15.0,
    engine_wake_s=1.0,
)


def test_ready_time_per_tier() -> None:
    size = int(40 * GB)
    assert ready_time_s(size, Tier.HOT, TIMINGS) == 0.0
    assert ready_time_s(size, Tier.WARM, TIMINGS) == pytest.approx(40 / 20 + 1.0)
    assert ready_time_s(size, Tier.COLD, TIMINGS) == pytest.approx(40 / 4 + 15.0)  # disk is the slower stage


def test_ready_time_shards_over_gpus_and_pays_for_eviction() -> None:
    size = int(40 * GB)
    assert ready_time_s(size, Tier.WARM, TIMINGS, gpus=4) == pytest.approx(40 / 80 + 1.0)
    assert ready_time_s(size, Tier.WARM, TIMINGS, gpus=2, evict_bytes=int(20 * GB)) == pytest.approx(
        20 / 20 + 40 / 40 + 1.0
    )
    # Cold over 4 GPUs: the single NVMe still bounds it.
    assert ready_time_s(size, Tier.COLD, TIMINGS, gpus=4) == pytest.approx(40 / 4 + 15.0)
    # With a fast disk, the PCIe stage bounds a cold load.
    fast_disk = CacheTimings(host_to_gpu_gb_per_s=20.0, nvme_to_host_gb_per_s=100.0, engine_cold_start_s=15.0)
    assert ready_time_s(size, Tier.COLD, fast_disk) == pytest.approx(40 / 20 + 15.0)


def test_default_timings_order_the_tiers_for_a_70b_model() -> None:
    size = int(138 * GB)
    hot, warm, cold = (ready_time_s(size, tier, gpus=4) for tier in Tier)
    assert hot < warm < 10.0 < 30.0 < cold < 90.0  # seconds wake, tens of seconds reload


def test_bad_inputs_are_refused() -> None:
    with pytest.raises(ValueError, match="gpus"):
        ready_time_s(1, Tier.COLD, TIMINGS, gpus=0)
    with pytest.raises(ValueError, match="nvme_to_host_gb_per_s"):
        CacheTimings(nvme_to_host_gb_per_s=0.0)


def test_admit_evicts_lowest_priority_then_least_recently_used() -> None:
    state = NodeCacheState(host_capacity_bytes=100)
    for name, size, priority, t in (("a", 30, 1, 0.0), ("b", 30, 0, 5.0), ("c", 30, 1, 2.0)):
        evicted, state = admit_warm(state, name, size, priority, t)
        assert evicted == []
    state = touch(state, "a", 10.0)
    evicted, state = admit_warm(state, "d", 40, 1, 11.0)  # needs 30 more: b (priority 0) goes first
    assert evicted == ["b"] and state.used_bytes == 100
    evicted, state = admit_warm(state, "e", 30, 1, 12.0)  # then c (priority 1, used at 2 s before a at 10 s)
    assert evicted == ["c"]
    assert set(state.warm) == {"a", "d", "e"} and tier_of(state, "a") is Tier.WARM and tier_of(state, "b") is Tier.COLD


def test_admit_never_evicts_a_more_important_model_and_is_all_or_nothing() -> None:
    state = NodeCacheState(host_capacity_bytes=100)
    _, state = admit_warm(state, "low", 40, 0, 0.0)
    _, state = admit_warm(state, "high", 50, 5, 0.0)
    evicted, state = admit_warm(state, "mid", 60, 1, 1.0)  # would need 'high' to go too: refused
    assert evicted == [] and set(state.warm) == {"low", "high"} and state.used_bytes == 90
    evicted, state = admit_warm(state, "huge", 101, 9, 1.0)  # bigger than the whole cache
    assert evicted == [] and "huge" not in state.warm


def test_readmission_updates_size_and_drop_frees() -> None:
    state = NodeCacheState(host_capacity_bytes=100)
    _, state = admit_warm(state, "a", 40, 0, 0.0)
    _, state = admit_warm(state, "a", 60, 2, 1.0)
    assert state.used_bytes == 60 and state.warm["a"].priority == 2
    state = drop_warm(state, "a")
    assert state.used_bytes == 0 and tier_of(state, "a") is Tier.COLD


@given(
    capacity=st.integers(0, 200),
    ops=st.lists(
        st.tuples(st.sampled_from("abcdefg"), st.integers(0, 120), st.integers(0, 3), st.booleans()), max_size=60
    ),
)
def test_host_capacity_is_never_exceeded(capacity: int, ops: list[tuple[str, int, int, bool]]) -> None:
    state = NodeCacheState(host_capacity_bytes=capacity)
    for step, (model, size, priority, drop) in enumerate(ops):
        before = dict(state.warm)
        if drop:
            state = drop_warm(state, model)
        else:
            evicted, state = admit_warm(state, model, size, priority, float(step))
            assert all(before[name].priority <= priority for name in evicted)
            if size > capacity:
                assert model not in state.warm and evicted == []
            elif not evicted and model not in state.warm:
                assert any(entry.priority > priority for entry in state.warm.values())  # refused: others matter more
        assert state.used_bytes == sum(entry.bytes for entry in state.warm.values()) <= capacity


def _hot(key: int, size: int, priority: int, used: float, idle: bool) -> HotModel:
    return HotModel(key, f"m{key}", size, priority, used, idle)


def test_gpu_victims_by_priority_then_lru_idle_only_at_equal_priority() -> None:
    hot = [_hot(1, 20, 1, 5.0, True), _hot(2, 20, 1, 1.0, True), _hot(3, 20, 0, 9.0, True), _hot(4, 50, 1, 0.0, False)]
    assert choose_gpu_victims(hot, need_bytes=10, free_bytes=10, for_priority=1) == []
    assert choose_gpu_victims(hot, need_bytes=30, free_bytes=10, for_priority=1) == [3]
    assert choose_gpu_victims(hot, need_bytes=50, free_bytes=10, for_priority=1) == [3, 2]
    assert choose_gpu_victims(hot, need_bytes=80, free_bytes=10, for_priority=1) is None  # 4 is busy, same priority


def test_higher_priority_preempts_lower_even_busy() -> None:
    hot = [_hot(1, 40, 0, 9.0, False), _hot(2, 40, 2, 0.0, False)]
    assert choose_gpu_victims(hot, need_bytes=40, free_bytes=0, for_priority=0) is None
    assert choose_gpu_victims(hot, need_bytes=40, free_bytes=0, for_priority=1) == [1]
    assert choose_gpu_victims(hot, need_bytes=80, free_bytes=0, for_priority=1) is None  # 2 is more important
    idle_low = [_hot(5, 40, 0, 9.0, False), _hot(6, 40, 0, 1.0, True)]
    assert choose_gpu_victims(idle_low, need_bytes=40, free_bytes=0, for_priority=3) == [6]  # idle before busy


@given(
    hot=st.lists(
        st.builds(
            HotModel,
            key=st.integers(0, 1000),
            model=st.just("m"),
            bytes=st.integers(0, 50),
            priority=st.integers(0, 3),
            last_used_s=st.floats(0, 100),
            idle=st.booleans(),
        ),
        max_size=8,
        unique_by=lambda h: h.key,
    ),
    need=st.integers(0, 200),
    free=st.integers(0, 100),
    priority=st.integers(0, 3),
)
def test_gpu_victims_free_enough_and_never_a_protected_busy_replica(
    hot: list[HotModel], need: int, free: int, priority: int
) -> None:
    victims = choose_gpu_victims(hot, need, free, priority)
    by_key = {h.key: h for h in hot}
    allowed = sum(h.bytes for h in hot if h.idle or h.priority < priority)
    if victims is None:
        assert free + allowed < need
        return
    assert free + sum(by_key[k].bytes for k in victims) >= need
    assert len(set(victims)) == len(victims)
    assert all(by_key[k].idle or by_key[k].priority < priority for k in victims)
