"""The engine model: continuous batching, the paged KV cache, preemption by recompute, priority, fast-forward."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tessera.serving.policies.engine import Engine
from tessera.serving.policies.engine_parts import Completion, EngineConfig
from tessera.serving.policies.requests import DEFAULT_SLO_TARGETS, InferenceRequest, SloClass


@dataclass(frozen=True)
class AffineTimes:
    """iteration = base + per_prefill x prefill tokens + per_seq x batch + per_kv x KV tokens."""

    base: float = 0.010
    per_prefill: float = 0.0001
    per_seq: float = 0.0002
    per_kv: float = 0.000001

    def iteration_s(self, prefill_tokens: int, decode_batch: int, kv_tokens: int) -> float:
        return self.base + self.per_prefill * prefill_tokens + self.per_seq * decode_batch + self.per_kv * kv_tokens

    def decode_affine(self, decode_batch: int) -> tuple[float, float]:
        return self.base + self.per_seq * decode_batch, self.per_kv


TIMES = AffineTimes()


def request(i: int, arrival: float, prompt: int, output: int, slo: SloClass = SloClass.INTERACTIVE) -> InferenceRequest:
    deadline = arrival + DEFAULT_SLO_TARGETS[slo].ttft_s
    return InferenceRequest(i, "m", arrival, prompt, output, slo=slo, deadline_s=deadline)


def run(engine: Engine, requests: list[InferenceRequest], check: bool = True) -> list[Completion]:
    """Submit in arrival order, then drain; checks the cache books after every call."""
    done: list[Completion] = []
    for r in sorted(requests, key=lambda r: r.arrival_s):
        done += engine.submit(r, r.arrival_s)
        if check:
            assert_books(engine)
    while not math.isinf(engine.next_event_s):
        done += engine.advance(engine.next_event_s)
        if check:
            assert_books(engine)
    assert engine.idle
    assert engine.free_blocks == engine.config.kv_blocks
    return done


def assert_books(engine: Engine) -> None:
    held = sum(s.blocks for s in engine.running)
    assert engine.free_blocks >= 0
    assert held + engine.free_blocks == engine.config.kv_blocks
    assert all(s.blocks == 0 for s in engine.waiting)
    for s in engine.running:
        assert s.blocks >= engine.config.blocks_for(s.kv)


def test_one_request_costs_one_prefill_then_a_decode_per_token() -> None:
    engine = Engine(EngineConfig(kv_blocks=1000), TIMES)
    (done,) = run(engine, [request(0, 1.0, prompt=100, output=5)])
    prefill = TIMES.iteration_s(100, 0, 0)
    assert done.first_token_s == pytest.approx(1.0 + prefill)
    decode = sum(TIMES.iteration_s(0, 1, 100 + i) for i in range(4))  # tokens 2..5, context 100..103
    assert done.finish_s == pytest.approx(1.0 + prefill + decode)
    assert done.ttft_s == pytest.approx(prefill)
    assert done.tpot_s == pytest.approx(decode / 4)
    assert engine.iterations == 5


def test_a_long_prompt_is_prefilled_in_chunks_of_the_token_budget() -> None:
    engine = Engine(EngineConfig(kv_blocks=1000, max_batch_tokens=512), TIMES)
    (done,) = run(engine, [request(0, 0.0, prompt=1200, output=1)])
    chunks = [512, 512, 176]
    assert done.first_token_s == pytest.approx(sum(TIMES.iteration_s(c, 0, 0) for c in chunks))
    assert engine.iterations == 3


def test_without_chunking_a_prompt_is_prefilled_whole() -> None:
    engine = Engine(EngineConfig(kv_blocks=1000, max_batch_tokens=512, chunked_prefill=False), TIMES)
    (done,) = run(engine, [request(0, 0.0, prompt=1200, output=1)])
    assert done.first_token_s == pytest.approx(TIMES.iteration_s(1200, 0, 0))


def test_a_request_joins_the_running_batch_at_the_next_iteration_boundary() -> None:
    engine = Engine(EngineConfig(kv_blocks=1000), TIMES)
    first = request(0, 0.0, prompt=10, output=1000)
    second = request(1, 0.5, prompt=10, output=2)
    done = {c.request.id: c for c in run(engine, [first, second])}
    # The second one's prefill starts at the first boundary at or after 0.5 s, not at 0.5 s and not at the end.
    assert 0.5 < done[1].first_token_s < 0.5 + 0.05
    assert done[1].finish_s < done[0].finish_s


def test_fast_forward_gives_the_same_times_as_one_iteration_at_a_time() -> None:
    reqs = [request(i, 0.05 * i, prompt=50 + 37 * i, output=20 + 13 * (i % 5)) for i in range(12)]
    fast = run(Engine(EngineConfig(kv_blocks=200), TIMES), reqs)
    slow_engine = Engine(EngineConfig(kv_blocks=200, fast_forward=False), TIMES)
    slow = run(slow_engine, reqs)
    by_id = {c.request.id: c for c in slow}
    assert len(fast) == len(slow) == len(reqs)
    for c in fast:
        assert c.first_token_s == pytest.approx(by_id[c.request.id].first_token_s)
        assert c.finish_s == pytest.approx(by_id[c.request.id].finish_s)


def test_a_full_cache_preempts_by_recompute_and_still_serves_everyone() -> None:
    engine = Engine(EngineConfig(kv_blocks=20, block_tokens=16), TIMES)  # 320 tokens of cache
    reqs = [request(i, 0.0, prompt=60, output=100) for i in range(4)]
    done = run(engine, reqs)
    assert sorted(c.request.id for c in done) == [0, 1, 2, 3]
    assert engine.preemptions > 0
    assert any(c.preemptions for c in done)


def test_a_request_that_can_never_fit_is_refused_with_a_reason() -> None:
    engine = Engine(EngineConfig(kv_blocks=4), TIMES)
    (done,) = engine.submit(request(0, 0.0, prompt=60, output=10), 0.0)
    assert "KV cache" in done.refused
    assert engine.idle


def test_an_urgent_request_preempts_batch_work_when_the_cache_is_full() -> None:
    engine = Engine(EngineConfig(kv_blocks=40), TIMES)
    batch = [request(i, 0.0, prompt=150, output=400, slo=SloClass.BATCH) for i in range(3)]
    urgent = request(9, 1.0, prompt=150, output=5, slo=SloClass.INTERACTIVE)
    done = {c.request.id: c for c in run(engine, [*batch, urgent])}
    assert done[9].ttft_s < 0.1  # it did not wait for the batch requests to finish
    assert done[9].finish_s < min(done[i].finish_s for i in range(3))


def test_slowdown_stretches_iterations_from_the_next_boundary() -> None:
    alone = run(Engine(EngineConfig(kv_blocks=1000), TIMES), [request(0, 0.0, prompt=10, output=100)])[0]
    engine = Engine(EngineConfig(kv_blocks=1000), TIMES)
    engine.submit(request(0, 0.0, prompt=10, output=100), 0.0)
    engine.set_slowdown(2.0, 0.0)
    shared = run(engine, [])[0]
    assert shared.finish_s == pytest.approx(2 * alone.finish_s, rel=0.05)


def test_load_counts_queued_running_and_predicted_tokens() -> None:
    engine = Engine(EngineConfig(kv_blocks=1000, max_running=1, predicted_output_tokens=50), TIMES)
    engine.submit(request(0, 0.0, prompt=100, output=10), 0.0)
    engine.submit(request(1, 0.0, prompt=30, output=10), 0.0)
    load = engine.load()
    assert (load.queued, load.running) == (1, 1)
    assert load.predicted_tokens == 30 + 50 + 100 + 50
    assert load.prefill_tokens == 30 + 100  # waiting, and admitted but not yet prefilled
    assert 0 < load.kv_free_frac < 1
    engine.advance(engine.next_event_s)
    assert engine.load().prefill_tokens == 30


@dataclass
class LoggedTimes:
    """AffineTimes that log every iteration's (prefill tokens, decode batch) as the engine asks for it."""

    calls: list[tuple[int, int]]

    def iteration_s(self, prefill_tokens: int, decode_batch: int, kv_tokens: int) -> float:
        self.calls.append((prefill_tokens, decode_batch))
        return TIMES.iteration_s(prefill_tokens, decode_batch, kv_tokens)

    def decode_affine(self, decode_batch: int) -> tuple[float, float]:
        return TIMES.decode_affine(decode_batch)


@pytest.mark.parametrize(
    ("prefill_first", "prompt", "batch_with_it"),
    [
        (True, 99, 1),  # the prompt takes 99 of the 100 tokens: one decoder fills the last, the other skips
        (True, 150, 0),  # a prompt over the budget runs alone (prefill-only iteration); both decoders skip
        (False, 99, 2),  # decodes first: both decoders run, the prompt still goes whole (the only one)
        (False, 150, 2),
    ],
)
def test_prefill_first_gives_the_budget_to_prompts_and_decoders_fill_what_is_left(
    prefill_first: bool, prompt: int, batch_with_it: int
) -> None:
    times = LoggedTimes([])
    config = EngineConfig(kv_blocks=1000, max_batch_tokens=100, chunked_prefill=False, prefill_first=prefill_first)
    engine = Engine(config, times)
    decoding = [request(0, 0.0, prompt=10, output=50), request(1, 0.0, prompt=10, output=50)]
    done = run(engine, [*decoding, request(2, 0.2, prompt=prompt, output=3)])
    assert (prompt, batch_with_it) in times.calls
    assert sorted(c.request.id for c in done) == [0, 1, 2]
    if prefill_first and batch_with_it < 2:
        # A skipped decoder got no token in that iteration: it finishes after the one that ran (or both later).
        by_id = {c.request.id: c for c in done}
        alone = run(Engine(config, TIMES), decoding)
        assert max(by_id[i].finish_s for i in (0, 1)) > max(c.finish_s for c in alone)


requests_strategy = st.lists(
    st.tuples(
        st.floats(0, 5),  # arrival
        st.integers(1, 300),  # prompt
        st.integers(1, 200),  # output
        st.sampled_from(list(SloClass)),
    ),
    min_size=1,
    max_size=40,
)


@given(
    specs=requests_strategy,
    kv_blocks=st.integers(8, 120),
    budget=st.sampled_from([64, 256, 2048]),
    chunked=st.booleans(),
    fast=st.booleans(),
    prefill_first=st.booleans(),
)
def test_no_request_is_lost_or_served_twice_and_blocks_are_never_over_allocated(
    specs: list[tuple[float, int, int, SloClass]],
    kv_blocks: int,
    budget: int,
    chunked: bool,
    fast: bool,
    prefill_first: bool,
) -> None:
    config = EngineConfig(
        kv_blocks=kv_blocks,
        max_batch_tokens=budget,
        chunked_prefill=chunked,
        fast_forward=fast,
        prefill_first=prefill_first,
    )
    engine = Engine(config, TIMES)
    reqs = [request(i, a, p, o, c) for i, (a, p, o, c) in enumerate(specs)]
    done = run(engine, reqs)  # checks the books after every call
    assert sorted(c.request.id for c in done) == list(range(len(reqs)))
    for c in done:
        if c.refused:
            assert c.request.prompt_tokens + c.request.output_tokens > config.max_tokens
        else:
            assert c.request.arrival_s < c.first_token_s <= c.finish_s


@given(specs=requests_strategy, kv_blocks=st.integers(30, 120))
def test_a_lower_class_is_never_admitted_while_a_higher_class_waits(
    specs: list[tuple[float, int, int, SloClass]], kv_blocks: int
) -> None:
    engine = Engine(EngineConfig(kv_blocks=kv_blocks, max_batch_tokens=256), TIMES)
    reqs = [request(i, a, p, o, c) for i, (a, p, o, c) in enumerate(specs)]
    done = [c for c in run(engine, reqs) if not c.refused]
    for high in done:
        waited_until = high.admitted_s[0]
        for low in done:
            if low.request.slo <= high.request.slo:
                continue
            assert not any(high.request.arrival_s < t < waited_until for t in low.admitted_s), (high, low)


# ------------------------------------------------------------------------------------------------------ cancel
# Engine.cancel: a client that goes away frees its sequence's KV blocks at once and never completes; the others are
# served as before (the live sim engine calls it when a stream's connection drops).


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
