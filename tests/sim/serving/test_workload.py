"""Splitting one trace into N models: sizes by rank, Zipf shares, load scaling, independent bursts, SLO classes,
sessions and prefixes; and the synthetic Azure-like trace."""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tessera.core.errors import InvalidRequestError
from tessera.serving.models import KNOWN_ARCHITECTURES, ModelSpec
from tessera.serving.policies.requests import DEFAULT_SLO_TARGETS, SloClass
from tessera.sim.serving.synthetic_trace import synthetic_llm_trace
from tessera.sim.serving.trace import TraceArrays, make_trace
from tessera.sim.serving.workload import (
    BLOCK_TOKENS,
    DEFAULT_PREFIX_BLOCK_CAP,
    SYSTEM_PROMPT_BLOCKS,
    Workload,
    assign_models,
    build_workload,
)


@pytest.fixture(scope="module")
def trace() -> TraceArrays:
    return synthetic_llm_trace(seed=7, duration_s=1800.0, rate_per_s=8.0)


def _burst_trace() -> TraceArrays:
    """3,000 requests: 2,700 inside one 60 s burst at the start of an hour, 300 spread over the rest."""
    rng = np.random.default_rng(1)
    arrivals = np.concatenate([rng.uniform(0, 60, 2700), rng.uniform(60, 3600, 300)])
    tokens = np.full(arrivals.size, 100, dtype=np.int64)
    return make_trace("burst", arrivals, tokens, tokens, "synthetic")


def _within(count: int, expected: float, sigmas: float = 5.0) -> bool:
    """A binomial-like count within ``sigmas`` standard deviations of its expectation."""
    return abs(count - expected) <= sigmas * math.sqrt(expected) + 1


def _arrivals_of(workload: Workload, model: str) -> np.ndarray:
    return np.array([r.arrival_s for r in workload.requests if r.model == model])


def _busiest_minute(arrivals: np.ndarray, duration_s: float) -> tuple[float, int]:
    """The start and the count of the busiest 60 s window, wrapping around the trace's end."""
    times = np.sort(arrivals)
    doubled = np.concatenate([times, times + duration_s])
    counts = np.searchsorted(doubled, times + 60.0) - np.arange(times.size)
    best = int(np.argmax(counts))
    return float(times[best]), int(counts[best])


def test_sizes_follow_the_documented_pattern_by_rank() -> None:
    models = assign_models(8, 1.0)
    assert [m.name for m in models] == [
        "m00-llama2-13b", "m01-llama3-8b", "m02-llama2-70b", "m03-llama2-7b",
        "m04-llama2-13b", "m05-llama3-8b", "m06-codellama-34b", "m07-llama2-7b",
    ]  # fmt: skip
    sizes = [m.spec.params_b for m in models]
    assert sum(s < 9 for s in sizes) == 4 and sum(9 < s < 20 for s in sizes) == 2 and sum(s > 30 for s in sizes) == 2
    assert min(sizes) < sizes[0] < max(sizes)  # the most popular model is neither the largest nor the smallest
    assert [m.rank for m in models] == list(range(1, 9))
    assert assign_models(10, 1.0)[8].name == "m08-llama2-13b"  # the pattern repeats
    assert assign_models(101, 1.0)[100].name.startswith("m100-")
    assert assign_models(101, 1.0)[0].name.startswith("m000-")
    assert [m.spec.name for m in assign_models(3, 1.0, ["llama2-70b"])] == ["llama2-70b"] * 3


def test_the_mix_may_name_bloom_176b_and_brought_models_and_names_how_to_bring_others() -> None:
    """Issue 27: only the five catalog models could be named, even bloom-176b of the Splitwise grid."""
    assert [m.name for m in assign_models(2, 1.0, ["bloom-176b"])] == ["m00-bloom-176b", "m01-bloom-176b"]
    mine = ModelSpec("mine", 3.0, layers=24, hidden=3072, heads=24, kv_heads=8, head_dim=128)
    known = {**KNOWN_ARCHITECTURES, "mine": mine}
    models = assign_models(3, 1.0, ["mine", "llama3-8b"], known)
    assert [m.name for m in models] == ["m00-mine", "m01-llama3-8b", "m02-mine"] and models[0].spec is mine
    with pytest.raises(InvalidRequestError) as caught:
        assign_models(2, 1.0, ["mine"])
    assert "unknown model 'mine'" in caught.value.message and "bloom-176b" in caught.value.message
    assert "--model-config NAME=config.json" in caught.value.message


@pytest.mark.parametrize("zipf", [0.0, 0.9, 1.2])
def test_shares_are_zipf_and_sum_to_one(zipf: float) -> None:
    shares = [m.share for m in assign_models(16, zipf)]
    assert sum(shares) == pytest.approx(1.0)
    for rank in range(2, 17):
        assert shares[0] / shares[rank - 1] == pytest.approx(rank**zipf)


@pytest.mark.parametrize(("models", "zipf", "load"), [(8, 1.0, 1.0), (8, 1.2, 5.0), (32, 0.9, 0.5), (1, 1.0, 2.5)])
def test_counts_follow_the_shares_and_the_total_rate_is_load_times_the_trace_rate(
    trace: TraceArrays, models: int, zipf: float, load: float
) -> None:
    workload = build_workload(trace, models, zipf, load, seed=3)

    assert _within(len(workload.requests), load * len(trace))
    assert workload.rate_per_s == pytest.approx(load * trace.rate_per_s, rel=0.05)
    for model in workload.models:
        count = workload.requests_per_model[model.name]
        assert _within(count, load * model.share * len(trace)), (model.name, count)
    assert sum(workload.requests_per_model.values()) == len(workload.requests)


def test_requests_are_sorted_numbered_in_the_trace_duration_and_copy_their_trace_row(trace: TraceArrays) -> None:
    workload = build_workload(trace, 8, 1.0, 2.0, seed=0)
    arrivals = np.array([r.arrival_s for r in workload.requests])

    assert [r.id for r in workload.requests] == list(range(len(workload.requests)))
    assert np.all(np.diff(arrivals) >= 0)
    assert arrivals.min() >= 0 and arrivals.max() < trace.duration_s
    assert workload.duration_s == trace.duration_s
    rows = workload.trace_rows
    assert [r.prompt_tokens for r in workload.requests] == trace.prompt_tokens[rows].tolist()
    assert [r.output_tokens for r in workload.requests] == trace.output_tokens[rows].tolist()
    for r in workload.requests:
        assert r.deadline_s == r.arrival_s + DEFAULT_SLO_TARGETS[r.slo].ttft_s


def test_a_seed_reproduces_and_another_seed_differs(trace: TraceArrays) -> None:
    def key(workload: Workload) -> list[tuple[object, ...]]:
        return [(r.model, r.arrival_s, r.prompt_tokens, r.slo, r.session, r.prefix) for r in workload.requests]

    first = build_workload(trace, 8, 1.0, 1.0, seed=11)
    assert key(first) == key(build_workload(trace, 8, 1.0, 1.0, seed=11))
    other = build_workload(trace, 8, 1.0, 1.0, seed=12)
    assert [r.arrival_s for r in first.requests[:100]] != [r.arrival_s for r in other.requests[:100]]
    # The SLO mix has a stream of its own: changing it leaves the arrivals alone.
    batch_only = build_workload(trace, 8, 1.0, 1.0, seed=11, slo_mix={SloClass.BATCH: 1.0})
    assert [r.arrival_s for r in batch_only.requests] == [r.arrival_s for r in first.requests]
    assert {r.slo for r in batch_only.requests} == {SloClass.BATCH}


def test_bursts_of_different_models_land_at_independent_times() -> None:
    burst = _burst_trace()
    gaps = []
    for seed in range(20):
        workload = build_workload(burst, 2, 0.0, 1.0, seed)
        (start_a, count_a), (start_b, count_b) = (
            _busiest_minute(_arrivals_of(workload, m.name), burst.duration_s) for m in workload.models
        )
        # Each model keeps the burst: most of its requests within one minute (its own minute).
        assert count_a > 0.8 * workload.requests_per_model[workload.models[0].name]
        assert count_b > 0.8 * workload.requests_per_model[workload.models[1].name]
        gap = abs(start_a - start_b) % burst.duration_s
        gaps.append(min(gap, burst.duration_s - gap))
    # Shared offsets would put both bursts in the same minute for every seed; independent ones spread the gap
    # uniformly over [0, half the duration].
    assert sum(gap < 60 for gap in gaps) <= 3
    assert np.mean(gaps) > 0.25 * burst.duration_s
    # And the two models thin the trace independently: not the same rows shifted.
    workload = build_workload(burst, 2, 0.0, 1.0, seed=0)
    owners = np.array([r.model for r in workload.requests])
    rows_of = [set(workload.trace_rows[owners == m.name].tolist()) for m in workload.models]
    overlap = len(rows_of[0] & rows_of[1]) / len(rows_of[0] | rows_of[1])
    assert 0.2 < overlap < 0.5  # independent thinning at keep probability 1/2 overlaps by 1/3 in expectation


def test_a_load_above_one_superposes_independently_shifted_copies() -> None:
    burst = _burst_trace()
    workload = build_workload(burst, 1, 1.0, 3.0, seed=0)
    arrivals = _arrivals_of(workload, workload.models[0].name)
    assert len(arrivals) == 3 * 3000  # three whole copies (keep probability 1)
    # Three copies of the one-minute burst at three different minutes: take out the busiest minute twice.
    found = []
    for _ in range(3):
        start, count = _busiest_minute(arrivals, burst.duration_s)
        found.append(count)
        arrivals = arrivals[(arrivals - start) % burst.duration_s >= 60.0]
    assert min(found) > 0.8 * 2700


def test_slo_classes_follow_the_default_mix(trace: TraceArrays) -> None:
    workload = build_workload(trace, 4, 1.0, 1.0, seed=5)
    n = len(workload.requests)
    for slo, share in ((SloClass.INTERACTIVE, 0.7), (SloClass.STANDARD, 0.2), (SloClass.BATCH, 0.1)):
        assert _within(sum(r.slo is slo for r in workload.requests), share * n)


def test_prefixes_share_the_system_prompt_and_the_conversation(trace: TraceArrays) -> None:
    workload = build_workload(trace, 4, 1.0, 1.0, seed=2, prefix_block_cap=24)
    previous_turn: dict[int, tuple[int, ...]] = {}
    system: dict[str, tuple[int, ...]] = {}
    sessions_of: dict[int, str] = {}
    continued = 0
    for r in workload.requests:
        assert len(r.prefix) == min(r.prompt_tokens // BLOCK_TOKENS, 24)
        if len(r.prefix) >= SYSTEM_PROMPT_BLOCKS:
            assert system.setdefault(r.model, r.prefix[:SYSTEM_PROMPT_BLOCKS]) == r.prefix[:SYSTEM_PROMPT_BLOCKS]
        assert sessions_of.setdefault(r.session, r.model) == r.model  # a conversation stays with one model
        before = previous_turn.get(r.session)
        if before is not None and len(r.prefix) > SYSTEM_PROMPT_BLOCKS:
            continued += 1
            shared = min(len(before), len(r.prefix) - 1)
            assert r.prefix[:shared] == before[:shared]  # the earlier turn's blocks
            assert r.prefix[shared:] != before[shared : len(r.prefix)]  # then the new message
        previous_turn[r.session] = r.prefix
    assert len({s[0] for s in system.values()}) == len(system)  # models have different system prompts
    # About 30% of requests open a conversation.
    assert _within(len(sessions_of), 0.3 * len(workload.requests), sigmas=6)
    assert continued > 0.5 * len(workload.requests)


def test_bad_arguments_name_their_field(trace: TraceArrays) -> None:
    cases: list[tuple[dict[str, object], str]] = [
        ({"models": 0}, "models"),
        ({"zipf": -0.5}, "zipf"),
        ({"load": 0.0}, "load"),
        ({"load": math.inf}, "load"),
        ({"slo_mix": {SloClass.BATCH: -1.0}}, "slo_mix"),
        ({"slo_mix": {}}, "slo_mix"),
        ({"model_sizes": ["gpt-5"]}, "model_sizes"),
    ]
    for change, field in cases:
        arguments: dict[str, object] = {"models": 4, "zipf": 1.0, "load": 1.0, "seed": 0, **change}
        with pytest.raises(InvalidRequestError) as caught:
            build_workload(trace, **arguments)  # type: ignore[arg-type]
        assert caught.value.field == field


def test_the_synthetic_trace_is_seeded_bursty_and_azure_like() -> None:
    first = synthetic_llm_trace(seed=0)
    assert np.array_equal(first.arrival_s, synthetic_llm_trace(seed=0).arrival_s)
    assert not np.array_equal(first.prompt_tokens[:50], synthetic_llm_trace(seed=1).prompt_tokens[:50])
    assert first.rate_per_s == pytest.approx(5.5, rel=0.05)
    assert 3500 < first.duration_s <= 3601
    assert 900 < np.median(first.prompt_tokens) < 1100 and 110 < np.median(first.output_tokens) < 145
    assert first.prompt_tokens.min() >= 1 and first.output_tokens.min() >= 1
    counts = np.histogram(first.arrival_s, np.arange(0, 3601, 30.0))[0]
    poisson_cv = 1 / math.sqrt(counts.mean())
    assert counts.std() / counts.mean() > 2 * poisson_cv  # burstier than a plain Poisson process
    assert first.name == "synthetic-azure-like"


def test_sessions_of_different_models_never_mix(trace: TraceArrays) -> None:
    workload = build_workload(trace, 8, 0.5, 1.0, seed=9)
    models_of: dict[int, set[str]] = defaultdict(set)
    for r in workload.requests:
        models_of[r.session].add(r.model)
    assert all(len(models) == 1 for models in models_of.values())


@settings(max_examples=40)
@given(
    arrivals=st.lists(st.floats(0.0, 1e4, allow_nan=False), min_size=1, max_size=60),
    models=st.integers(1, 12),
    zipf=st.floats(0.0, 2.0),
    load=st.floats(0.05, 6.0),
    seed=st.integers(0, 2**32 - 1),
)
def test_any_trace_gives_sorted_numbered_requests_inside_the_duration(
    arrivals: list[float], models: int, zipf: float, load: float, seed: int
) -> None:
    tokens = np.arange(1, len(arrivals) + 1, dtype=np.int64) * 17
    trace = make_trace("h", np.array(arrivals), tokens, tokens + 1, "synthetic")
    workload = build_workload(trace, models, zipf, load, seed)

    times = [r.arrival_s for r in workload.requests]
    assert times == sorted(times)
    assert all(0.0 <= t < trace.duration_s for t in times)
    assert [r.id for r in workload.requests] == list(range(len(times)))
    assert sum(workload.requests_per_model.values()) == len(times)
    for r, row in zip(workload.requests, workload.trace_rows.tolist(), strict=True):
        # make_trace sorted the rows by arrival: a request carries its sorted row's tokens, as written together.
        assert r.output_tokens == r.prompt_tokens + 1 == int(trace.prompt_tokens[row]) + 1
        assert len(r.prefix) == min(r.prompt_tokens // BLOCK_TOKENS, DEFAULT_PREFIX_BLOCK_CAP)
