"""Ties between equally cheap victim sets are broken alike in every runtime (test_same_decisions): by the order of
the workloads' numbers, not of their ids' text, and with run times compared to the microsecond."""

from __future__ import annotations

import pytest

from tessera.core.preemption import Candidate, _cost_fn, id_order, select_victims
from tessera.core.queueing.quotas import QuotaNeed
from tessera.core.queueing.resources import ResourceVector

NEED = QuotaNeed(ResourceVector.zero(), ResourceVector.zero(), None)
SHARE = ResourceVector(gpu_milli=300)


def victim(workload_id: str, started_s: float) -> Candidate:
    return Candidate(workload_id, "q", 0, True, started_s, True, SHARE, False)


@pytest.mark.parametrize(
    "ids",
    [("3", "9", "17"), ("4", "10", "18"), ("99", "100", "101"), ("0", "1", "2")],
    ids=["simulator", "server", "across-a-power-of-ten", "from-zero"],
)
def test_equally_cheap_victims_are_chosen_by_number_whatever_the_numbering(ids: tuple[str, ...]) -> None:
    """The simulator numbers a trace's jobs from 0 and the server its rows from 1: "job-3" is "3" in one and "4" in
    the other, "job-9" is "9" and "10". By text "10" < "4", so they once chose different victims."""
    candidates = [victim(i, 10.0) for i in reversed(ids)]
    assert select_victims("q", 1, SHARE, candidates, 50.0, quota=NEED) == [ids[0]]
    two = select_victims("q", 1, SHARE + SHARE, candidates, 50.0, quota=NEED)
    assert two == [ids[0], ids[1]]


def test_id_order_puts_numbers_in_numeric_order_and_other_ids_after_them() -> None:
    ordered = ["0", "2", "10", "100", "a", "b10", "b9", "job-1"]
    assert sorted(reversed(ordered), key=id_order) == ordered
    assert id_order("٣") == (1, 0, "٣")  # not an ASCII digit: compared as text


def test_sets_that_lose_the_same_work_tie_whatever_the_clock_origin() -> None:
    """Run times are differences of clock readings: with the server's clock near 1e6 s their rounding differs from
    the simulator's (0-based). Two sets that lose exactly 275.345 s must tie in both, and then the ids decide."""
    starts = {"1": 134.847, "2": 195.478, "3": 236.617, "4": 93.708}
    now = 302.835
    for origin in (0.0, 1_000_000.0):
        cost = _cost_fn(origin + now)
        first = cost([victim("1", origin + starts["1"]), victim("2", origin + starts["2"])])
        second = cost([victim("3", origin + starts["3"]), victim("4", origin + starts["4"])])
        assert first[:3] == second[:3]
        assert first < second  # the ids decide
    raw = [(now - starts["1"]) + (now - starts["2"]), (now - starts["3"]) + (now - starts["4"])]
    assert raw[0] != raw[1]  # without the rounding they would not tie at origin 0
