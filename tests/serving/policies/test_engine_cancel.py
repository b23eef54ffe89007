"""Engine.cancel: a client that goes away frees its sequence's KV blocks at once and never completes; the others are
served as before (the live sim engine calls it when a stream's connection drops)."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st
from test_engine import TIMES, assert_books, request, run

from tessera.serving.policies.engine import Engine
from tessera.serving.policies.engine_parts import Completion, EngineConfig


def test_a_waiting_request_cancelled_is_never_served() -> None:
    engine = Engine(EngineConfig(kv_blocks=1000, max_running=1), TIMES)
    engine.submit(request(0, 0.0, prompt=10, output=50), 0.0)
    engine.submit(request(1, 0.0, prompt=10, output=5), 0.0)
    assert engine.load().queued == 1
    engine.cancel(1, 0.001)
    assert engine.load().queued == 0
    assert engine.load().prefill_tokens == 10  # request 0 is still mid-prefill; request 1 no longer counts
    done = run(engine, [])
    assert [c.request.id for c in done] == [0]


def test_a_running_request_cancelled_frees_its_blocks_and_the_segment_ends_at_the_next_boundary() -> None:
    engine = Engine(EngineConfig(kv_blocks=1000), TIMES)
    engine.submit(request(0, 0.0, prompt=32, output=500), 0.0)
    engine.submit(request(1, 0.0, prompt=32, output=500), 0.0)
    engine.advance(1.0)
    assert engine.load().running == 2
    before_end = engine.next_event_s
    done = engine.cancel(0, 1.0)
    assert done == []
    assert engine.next_event_s < before_end  # the fast-forwarded segment was cut
    assert engine.load().running == 1
    assert_books(engine)
    assert engine.free_blocks == 1000 - engine.running[0].blocks
    rest = run(engine, [])
    assert [c.request.id for c in rest] == [1]


def test_cancelling_an_unknown_request_changes_nothing() -> None:
    engine = Engine(EngineConfig(kv_blocks=100), TIMES)
    engine.submit(request(0, 0.0, prompt=10, output=3), 0.0)
    engine.cancel(42, 0.0)
    assert [c.request.id for c in run(engine, [])] == [0]


@given(
    specs=st.lists(
        st.tuples(st.floats(0, 2), st.integers(1, 200), st.integers(1, 100), st.booleans(), st.floats(0, 1)),
        min_size=1,
        max_size=30,
    ),
    kv_blocks=st.integers(20, 120),
    fast=st.booleans(),
)
def test_cancelled_requests_never_complete_and_the_books_stay_balanced(
    specs: list[tuple[float, int, int, bool, float]], kv_blocks: int, fast: bool
) -> None:
    engine = Engine(EngineConfig(kv_blocks=kv_blocks, max_batch_tokens=256, fast_forward=fast), TIMES)
    events: list[tuple[float, int, int]] = []  # (time, 0 submit / 1 cancel, index)
    for i, (arrival, _, _, cancelled, after) in enumerate(specs):
        events.append((arrival, 0, i))
        if cancelled:
            events.append((arrival + after, 1, i))
    done: list[Completion] = []
    for t, kind, i in sorted(events):
        if kind == 0:
            _, prompt, output, _, _ = specs[i]
            done += engine.submit(request(i, t, prompt, output), t)
        else:
            done += engine.cancel(i, t)
        assert_books(engine)
    while not math.isinf(engine.next_event_s):
        done += engine.advance(engine.next_event_s)
        assert_books(engine)
    assert engine.free_blocks == kv_blocks
    served = {c.request.id: c for c in done}
    for i, (arrival, _, _, cancelled, after) in enumerate(specs):
        if not cancelled:
            assert i in served
        elif i in served:
            assert served[i].finish_s <= arrival + after  # it finished (or was refused) before the cancel
