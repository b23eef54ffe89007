"""Weighted DRF ordering, water-filling and entitlement (with a worked example)."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tessera.core.queueing import QueueSpec, QueueUsage, ResourceVector, dominant_share, drf_order, entitlement
from tessera.core.queueing.fairshare import water_fill

CAPACITY = ResourceVector(gpu_milli=16_000, cpu_milli=256_000, mem_mib=1_024_000)


def gpus(n: float) -> ResourceVector:
    return ResourceVector(gpu_milli=int(n * 1000))


def test_dominant_share_is_the_largest_fraction() -> None:
    assert dominant_share(ResourceVector(4000, 128_000, 0), CAPACITY) == 0.5  # CPU dominates
    assert dominant_share(ResourceVector(8000, 0, 0), CAPACITY) == 0.5
    assert dominant_share(ResourceVector.zero(), CAPACITY) == 0.0


def test_drf_order_lowest_weighted_share_first_ties_by_name() -> None:
    queues = [
        QueueUsage("gpu-heavy", 1.0, ResourceVector(8000, 16_000, 0)),  # 0.5
        QueueUsage("cpu-heavy", 1.0, ResourceVector(1000, 192_000, 0)),  # 0.75
        QueueUsage("weighted", 2.0, ResourceVector(12_000, 0, 0)),  # 0.75 / 2 = 0.375
        QueueUsage("b-idle", 1.0, ResourceVector.zero()),
        QueueUsage("a-idle", 1.0, ResourceVector.zero()),
    ]
    assert drf_order(queues, CAPACITY) == ["a-idle", "b-idle", "weighted", "gpu-heavy", "cpu-heavy"]
    assert drf_order([("x", 1.0, gpus(1))], CAPACITY) == ["x"]  # plain tuples work too


def test_water_fill_redistributes_what_small_claims_leave() -> None:
    assert water_fill(6.0, [("b", 1.0, 6.0), ("c", 2.0, 6.0)]) == {"b": 2.0, "c": 4.0}
    assert water_fill(6.0, [("b", 1.0, 6.0), ("c", 2.0, 1.0)]) == {"b": 5.0, "c": 1.0}
    assert water_fill(10.0, [("b", 1.0, 2.0), ("c", 1.0, 3.0)]) == {"b": 2.0, "c": 3.0}
    assert water_fill(5.0, [("b", 1.0, 0.0)]) == {"b": 0.0}


@given(
    st.floats(0, 1e6, allow_nan=False),
    st.lists(st.tuples(st.floats(0.1, 10), st.floats(0, 1e5)), min_size=1, max_size=8),
)
def test_water_fill_properties(pool: float, raw: list[tuple[float, float]]) -> None:
    claims = [(f"q{i}", w, room) for i, (w, room) in enumerate(raw)]
    given_ = water_fill(pool, claims)
    assert all(-1e-9 <= given_[name] <= room + 1e-6 for name, _, room in claims)
    total = sum(given_.values())
    assert total <= pool + 1e-6
    assert total == pytest.approx(min(pool, sum(room for _, _, room in claims)), rel=1e-9, abs=1e-6)
    # Unsaturated claims sit at one common weighted level: nobody below it while another gets more per weight.
    levels = [given_[n] / w for n, w, room in claims if given_[n] < room - 1e-6]
    if levels:
        assert max(levels) - min(levels) <= 1e-6 * max(1.0, max(levels))


def test_entitlement_worked_example() -> None:
    """16 GPUs; a (weight 1, nominal 8) wants 2, b (1, 4) wants 10, c (2, 4) wants 10.

    Owed nominal up to demand: a 2, b 4, c 4. Idle in the cohort: a's 6 unused. Rooms: b 6, c 6. Water-filling
    at weights 1:2 gives b 2 and c 4. Entitlements: a 2, b 6, c 8 GPUs.
    """
    queues = [
        QueueSpec("a", "lab", {"*": gpus(8)}),
        QueueSpec("b", "lab", {"*": gpus(4)}),
        QueueSpec("c", "lab", {"*": gpus(4)}, weight=2.0),
    ]
    demands = {"a": gpus(2), "b": gpus(10), "c": gpus(10)}
    assert entitlement(queues, CAPACITY, demands) == {"a": 2000.0, "b": 6000.0, "c": 8000.0}
    # c wants only 6: it is filled at 6 and b gets the rest of the idle 6 GPUs.
    assert entitlement(queues, CAPACITY, {**demands, "c": gpus(6)}) == {"a": 2000.0, "b": 8000.0, "c": 6000.0}


def test_entitlement_honours_limits_cohorts_and_capacity() -> None:
    queues = [
        QueueSpec("a", "lab", {"*": gpus(8)}, lending_limit={"*": gpus(2)}),
        QueueSpec("b", "lab", {"*": gpus(4)}, borrowing_limit={"*": gpus(1)}),
        QueueSpec("c", "lab", {"*": gpus(4)}),
        QueueSpec("solo", None, {"*": gpus(4)}),
    ]
    demands = {"b": gpus(10), "c": gpus(10), "solo": gpus(10)}
    # a lends at most 2: b takes 1 (its borrowing limit), c the other 1; solo never exceeds nominal.
    assert entitlement(queues, ResourceVector(gpu_milli=20_000), demands) == {
        "a": 0.0,
        "b": 5000.0,
        "c": 5000.0,
        "solo": 4000.0,
    }
    # Quotas of 20 GPUs on a 10-GPU cluster: nominal quotas are halved (limits are not): a lends 2 of its 4.
    halved = entitlement(queues, ResourceVector(gpu_milli=10_000), demands)
    assert halved == {"a": 0.0, "b": 3000.0, "c": 3000.0, "solo": 2000.0}
