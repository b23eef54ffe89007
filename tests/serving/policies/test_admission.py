"""Admission (only batch is shed), the priority heap (no starvation of a higher class), and holding from zero."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tessera.serving.policies.admission import (
    ADMIT,
    AdmissionConfig,
    AdmissionSignals,
    HoldQueue,
    RequestHeap,
    Shed,
    admit,
    expire,
    held_count,
    hold,
    next_expiry_s,
    release,
    withdraw,
)
from tessera.serving.policies.requests import InferenceRequest, SloClass


def _request(
    rid: int, slo: SloClass = SloClass.INTERACTIVE, deadline: float = 0.0, arrival: float = 0.0, model: str = "m"
) -> InferenceRequest:
    return InferenceRequest(rid, model, arrival, 10, 5, slo=slo, deadline_s=deadline)


CONFIG = AdmissionConfig(batch_max_wait_s=100.0, batch_max_queued_per_replica=8.0)


def test_batch_is_shed_on_a_long_wait_or_a_long_queue() -> None:
    calm = AdmissionSignals(ready_replicas=2, queued_requests=16, est_wait_s=100.0)
    assert admit(_request(1, SloClass.BATCH), calm, CONFIG) is ADMIT
    slow = AdmissionSignals(ready_replicas=2, queued_requests=0, est_wait_s=100.5)
    decision = admit(_request(2, SloClass.BATCH), slow, CONFIG)
    assert isinstance(decision, Shed) and "estimated wait 100.5 s > 100 s" in decision.reason
    crowded = AdmissionSignals(ready_replicas=2, queued_requests=17, est_wait_s=1.0)
    decision = admit(_request(3, SloClass.BATCH), crowded, CONFIG)
    assert isinstance(decision, Shed) and "8.5 queued per ready replica > 8" in decision.reason
    at_zero = AdmissionSignals(ready_replicas=0, queued_requests=9, est_wait_s=0.0)
    assert isinstance(admit(_request(4, SloClass.BATCH), at_zero, CONFIG), Shed)


def test_default_bound_is_the_batch_ttft_target() -> None:
    assert AdmissionConfig().batch_max_wait_s == 600.0
    with pytest.raises(ValueError, match="admission bounds"):
        AdmissionConfig(batch_max_wait_s=0.0)


@given(
    slo=st.sampled_from([SloClass.INTERACTIVE, SloClass.STANDARD]),
    ready=st.integers(0, 100),
    queued=st.integers(0, 10**6),
    wait=st.floats(0.0, 1e9),
)
def test_never_sheds_a_non_batch_request(slo: SloClass, ready: int, queued: int, wait: float) -> None:
    assert admit(_request(1, slo), AdmissionSignals(ready, queued, wait), CONFIG) is ADMIT


def test_heap_orders_by_class_then_deadline_then_arrival() -> None:
    heap = RequestHeap()
    for request in (
        _request(1, SloClass.BATCH, deadline=1.0),
        _request(2, SloClass.STANDARD, deadline=9.0),
        _request(3, SloClass.STANDARD, deadline=5.0),
        _request(4, SloClass.INTERACTIVE, deadline=50.0),
        _request(5, SloClass.STANDARD, deadline=5.0, arrival=-1.0),
    ):
        heap.push(request)
    assert heap.peek() is not None and heap.peek().id == 4  # type: ignore[union-attr]
    assert [heap.pop().id for _ in range(5)] == [4, 5, 3, 2, 1]  # type: ignore[union-attr]
    assert heap.pop() is None and heap.peek() is None and len(heap) == 0


_ops = st.lists(
    st.one_of(
        st.tuples(st.just("push"), st.sampled_from(list(SloClass)), st.floats(0.0, 100.0)),
        st.tuples(st.just("pop"), st.just(SloClass.BATCH), st.just(0.0)),
    ),
    max_size=80,
)


@given(ops=_ops)
def test_heap_never_serves_a_lower_class_while_a_higher_one_waits(ops: list[tuple[str, SloClass, float]]) -> None:
    heap, waiting, served = RequestHeap(), [], []
    for rid, (op, slo, deadline) in enumerate(ops):
        if op == "push":
            request = _request(rid, slo, deadline=deadline)
            heap.push(request)
            waiting.append(request)
            continue
        popped = heap.pop()
        if popped is None:
            assert not waiting
            continue
        assert all(popped.slo <= other.slo for other in waiting)
        assert all(popped.priority_key() <= other.priority_key() for other in waiting)
        waiting.remove(popped)
        served.append(popped.id)
    assert len(set(served)) == len(served)  # nobody served twice


def test_hold_then_release_in_priority_order() -> None:
    queue = HoldQueue(max_hold_s=30.0)
    queue = hold(queue, _request(1, SloClass.BATCH), 0.0)
    queue = hold(queue, _request(2, SloClass.INTERACTIVE, deadline=5.0), 1.0)
    queue = hold(queue, _request(3, SloClass.INTERACTIVE, deadline=3.0, model="other"), 2.0)
    assert held_count(queue, "m") == 2 and queue.count == 3 and next_expiry_s(queue) == 30.0
    released, queue = release(queue, "m")
    assert [r.id for r in released] == [2, 1]
    assert held_count(queue, "m") == 0 and queue.count == 1
    assert release(queue, "m")[0] == []


def test_withdraw_takes_one_held_request_out_and_no_other() -> None:
    queue = HoldQueue(max_hold_s=30.0)
    for rid in (1, 2, 3):
        queue = hold(queue, _request(rid), float(rid))
    gone, queue = withdraw(queue, "m", 2)
    assert gone and held_count(queue, "m") == 2 and queue.count == 2
    assert withdraw(queue, "m", 2)[0] is False and withdraw(queue, "other", 1)[0] is False
    assert [r.id for r in release(queue, "m")[0]] == [1, 3]
    queue = hold(queue, _request(4), 5.0)
    gone, queue = withdraw(queue, "m", 4)
    assert gone and queue.count == 0 and "m" not in queue.held and next_expiry_s(queue) is None


def test_expire_rejects_after_the_bound_with_a_reason() -> None:
    queue = HoldQueue(max_hold_s=30.0)
    for rid, t in ((1, 0.0), (2, 10.0), (3, 29.0)):
        queue = hold(queue, _request(rid), t)
    rejected, queue = expire(queue, 29.9)
    assert rejected == []
    rejected, queue = expire(queue, 40.0)
    assert [r.id for r, _ in rejected] == [1, 2]
    assert "held 40.0 s (limit 30 s) with no ready replica of model 'm'" in rejected[0][1]
    assert queue.count == 1 and next_expiry_s(queue) == 59.0
    with pytest.raises(ValueError, match="back in time"):
        hold(queue, _request(9), 28.0)


@given(
    events=st.lists(
        st.tuples(st.floats(0.0, 20.0), st.sampled_from(["hold", "release", "expire"]), st.sampled_from("ab")),
        max_size=60,
    )
)
def test_every_held_request_is_released_or_rejected_exactly_once(events: list[tuple[float, str, str]]) -> None:
    queue, now, seen = HoldQueue(max_hold_s=15.0), 0.0, []
    held: set[int] = set()
    for rid, (dt, op, model) in enumerate(events):
        now += dt
        if op == "hold":
            queue = hold(queue, _request(rid, model=model), now)
            held.add(rid)
        elif op == "release":
            out, queue = release(queue, model)
            seen += [r.id for r in out]
        else:
            rejected, queue = expire(queue, now)
            seen += [r.id for r, _ in rejected]
        assert queue.count == sum(held_count(queue, m) for m in "ab")
    for model in "ab":
        out, queue = release(queue, model)
        seen += [r.id for r in out]
    assert sorted(seen) == sorted(held) and queue.count == 0
