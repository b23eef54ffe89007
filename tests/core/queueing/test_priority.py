"""Priority classes and ordering within a queue (StrictFIFO and BestEffortFIFO)."""

from collections.abc import Callable

import pytest

from tessera.core.errors import InvalidRequestError
from tessera.core.queueing import (
    BUILTIN_PRIORITY_CLASSES,
    PendingEntry,
    PriorityClass,
    admissible_in_order,
    order_key,
    order_pending,
    resolve_priority_class,
)


def test_builtin_classes() -> None:
    assert resolve_priority_class("inference-critical") == PriorityClass("inference-critical", 1000, False)
    assert resolve_priority_class("training") == PriorityClass("training", 500, True)
    assert resolve_priority_class(" Best-Effort ") == PriorityClass("best-effort", 100, True)
    values = [c.value for c in BUILTIN_PRIORITY_CLASSES.values()]
    assert values == sorted(values, reverse=True)


def test_unknown_priority_class_names_the_field() -> None:
    with pytest.raises(InvalidRequestError) as err:
        resolve_priority_class("urgent")
    assert err.value.field == "priority_class" and "urgent" in str(err.value) and "training" in str(err.value)


def test_custom_classes() -> None:
    mine = {"gold": PriorityClass("gold", 7, preemptible=False)}
    assert resolve_priority_class("gold", mine).value == 7
    with pytest.raises(InvalidRequestError):
        resolve_priority_class("training", mine)


def test_order_is_priority_then_arrival_then_id() -> None:
    pending = [
        PendingEntry("late-high", 500, 30.0),
        PendingEntry("b", 100, 10.0),
        PendingEntry("a", 100, 10.0),
        PendingEntry("early-low", 100, 0.0),
        PendingEntry("critical", 1000, 99.0),
    ]
    assert [w.workload_id for w in order_pending(pending)] == ["critical", "late-high", "early-low", "a", "b"]
    assert order_key(500, 1.5, "x") == (-500, 1.5, "x")


def _capacity_fits(free_gpus: int, sizes: dict[str, int]) -> tuple[list[str], Callable[[str], bool]]:
    taken: list[str] = []
    state = {"free": free_gpus}

    def fits(workload_id: str) -> bool:
        if sizes[workload_id] <= state["free"]:
            state["free"] -= sizes[workload_id]  # reserves what it admits
            taken.append(workload_id)
            return True
        return False

    return taken, fits


def test_strict_fifo_stops_at_the_head_that_does_not_fit() -> None:
    sizes = {"a": 2, "big": 8, "c": 1, "d": 1}
    taken, fits = _capacity_fits(4, sizes)
    assert admissible_in_order(list(sizes), fits, "StrictFIFO") == ["a"]
    assert taken == ["a"]


def test_best_effort_fifo_lets_later_work_that_fits_go_ahead() -> None:
    sizes = {"a": 2, "big": 8, "c": 1, "d": 2}
    taken, fits = _capacity_fits(4, sizes)
    assert admissible_in_order(list(sizes), fits, "BestEffortFIFO") == ["a", "c"]
    assert taken == ["a", "c"]  # d no longer fits after c reserved its GPU


def test_unknown_strategy() -> None:
    with pytest.raises(InvalidRequestError) as err:
        admissible_in_order([], lambda _: True, "LIFO")  # type: ignore[arg-type]
    assert err.value.field == "strategy"
