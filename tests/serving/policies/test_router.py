"""Routers on crafted loads, the overload guard, and properties over random route sequences."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tessera.serving.policies.requests import InferenceRequest
from tessera.serving.policies.router import (
    ROUTER_NAMES,
    LoadWeights,
    OverloadGuard,
    PowerOfTwoRouter,
    PrefixAffinityRouter,
    ReplicaView,
    RouteDecision,
    SessionAffinityRouter,
    TokenJsqRouter,
    least_loaded,
    make_router,
)


def _request(rid: int = 0, prefix: tuple[int, ...] = (), session: int = -1) -> InferenceRequest:
    return InferenceRequest(rid, "m", 0.0, 64, 16, prefix=prefix, session=session)


def _view(
    replica: int, queued: int = 0, running: int = 0, tokens: int = 0, kv: float = 1.0, accepting: bool = True
) -> ReplicaView:
    return ReplicaView(replica, queued, running, tokens, kv, accepting)


RNG = np.random.default_rng(0)


def test_make_router_knows_every_name_and_names_them_on_error() -> None:
    for name in ROUTER_NAMES:
        assert make_router(name).name == name
    with pytest.raises(ValueError, match="unknown router 'fastest'.*least-load.*prefix-affinity"):
        make_router("fastest")


def test_round_robin_cycles_by_replica_id_and_skips_draining() -> None:
    router = make_router("round-robin")
    state = router.initial_state()
    views = [_view(7), _view(3), _view(5, accepting=False), _view(9)]
    chosen = []
    for _ in range(6):
        decision, state = router.route(_request(), views, state, 0.0, RNG)
        chosen.append(decision.replica)
    assert chosen == [3, 7, 9, 3, 7, 9]
    assert decision.reason == "round-robin"


def test_round_robin_survives_a_replica_leaving() -> None:
    router = make_router("round-robin")
    state = router.initial_state()
    state.last_replica = 7
    decision, _ = router.route(_request(), [_view(3), _view(9)], state, 0.0, RNG)
    assert decision.replica == 9


def test_least_load_weights_requests_and_tokens() -> None:
    router = make_router("least-load")
    state = router.initial_state()
    # loads: 2 + 0 = 2; 0 + 1 + 2048/1024 = 3; 1 + 0 + 512/1024 = 1.5
    views = [_view(0, queued=2), _view(1, running=1, tokens=2048), _view(2, queued=1, tokens=512)]
    decision, _ = router.route(_request(), views, state, 0.0, RNG)
    assert decision == decision.__class__(2, "least-load")
    heavy_tokens = make_router("least-load", weights=LoadWeights(tokens_per_unit=128.0))
    decision, _ = heavy_tokens.route(_request(), views, state, 0.0, RNG)
    assert decision.replica == 0  # 2 vs 1 + 16 vs 1 + 4


def test_least_load_ties_prefer_free_kv_then_lowest_id_whatever_the_order() -> None:
    views = [_view(5, queued=1, kv=0.2), _view(4, queued=1, kv=0.5), _view(2, queued=1, kv=0.5)]
    for order in (views, views[::-1]):
        position, load = least_loaded(order, LoadWeights())
        assert order[position].replica == 2 and load == 1.0


def test_no_accepting_replica_routes_nowhere() -> None:
    for name in ROUTER_NAMES:
        router = make_router(name)
        decision, _ = router.route(
            _request(prefix=(1, 2), session=3), [_view(0, accepting=False)], router.initial_state(), 0.0, RNG
        )
        assert decision.replica is None
        decision, _ = router.route(_request(), [], router.initial_state(), 0.0, RNG)
        assert decision.replica is None


def test_token_jsq_counts_prompt_tokens_to_prefill_plus_unfinished_requests() -> None:
    router = make_router("token-jsq")
    assert isinstance(router, TokenJsqRouter)
    state = router.initial_state()
    views = [
        ReplicaView(0, queued=1, running=3, predicted_tokens=10, kv_free_frac=1.0, prefill_tokens=500),  # 504
        ReplicaView(1, queued=0, running=40, predicted_tokens=90_000, kv_free_frac=0.1, prefill_tokens=0),  # 40
        ReplicaView(2, queued=2, running=0, predicted_tokens=5, kv_free_frac=1.0, prefill_tokens=100),  # 102
        ReplicaView(3, queued=0, running=0, predicted_tokens=0, kv_free_frac=1.0, accepting=False),  # draining
    ]
    decision, state = router.route(_request(), views, state, 0.0, RNG)
    # Blind to predicted decode work and to the cache: the 40 running requests count 40, not their 90k tokens.
    assert decision == RouteDecision(1, "token-jsq")
    views[1] = ReplicaView(1, queued=0, running=40, predicted_tokens=0, kv_free_frac=1.0, prefill_tokens=100)
    decision, _ = router.route(_request(), views, state, 0.0, RNG)
    assert decision.replica == 2  # 102 < 140


def test_token_jsq_ties_go_to_the_lowest_replica_id_whatever_the_order() -> None:
    router = make_router("token-jsq")
    views = [
        ReplicaView(9, 0, 2, 0, 1.0, prefill_tokens=10),
        ReplicaView(4, 1, 1, 0, 0.2, prefill_tokens=10),
        ReplicaView(6, 0, 2, 0, 0.9, prefill_tokens=10),
    ]
    for order in (views, views[::-1], [views[2], views[0], views[1]]):
        decision, _ = router.route(_request(), order, router.initial_state(), 0.0, RNG)
        assert decision.replica == 4


@given(
    views=st.lists(
        st.tuples(st.integers(0, 20), st.integers(0, 20), st.integers(0, 5_000), st.booleans()), min_size=1, max_size=8
    )
)
def test_token_jsq_picks_a_replica_with_the_least_token_queue(views: list[tuple[int, int, int, bool]]) -> None:
    router = make_router("token-jsq")
    replicas = [ReplicaView(i, q, r, 0, 1.0, accepting=a, prefill_tokens=t) for i, (q, r, t, a) in enumerate(views)]
    decision, _ = router.route(_request(), replicas, router.initial_state(), 0.0, RNG)
    accepting = [v for v in replicas if v.accepting]
    if not accepting:
        assert decision.replica is None
        return
    queue = {v.replica: v.prefill_tokens + v.queued + v.running for v in accepting}
    assert decision.replica is not None
    assert queue[decision.replica] == min(queue.values())
    assert decision.replica == min(rid for rid, q in queue.items() if q == min(queue.values()))


@given(
    loads=st.lists(st.tuples(st.integers(0, 20), st.integers(0, 20), st.integers(0, 10_000)), min_size=2, max_size=8),
    seed=st.integers(0, 2**32 - 1),
)
def test_power_of_two_never_picks_the_worse_of_its_two(loads: list[tuple[int, int, int]], seed: int) -> None:
    views = [_view(i, q, r, t) for i, (q, r, t) in enumerate(loads)]
    router = PowerOfTwoRouter()
    weights = router.weights
    # Replay the router's two draws with the same generator state to know its candidates.
    rng, shadow = np.random.default_rng(seed), np.random.default_rng(seed)
    decision, _ = router.route(_request(), views, router.initial_state(), 0.0, rng)
    n = len(views)
    first = min(int(shadow.random() * n), n - 1)
    second = min(int(shadow.random() * (n - 1)), n - 2)
    second += second >= first
    assert first != second
    assert decision.replica in (first, second)
    other = second if decision.replica == first else first
    assert weights.load(views[decision.replica]) <= weights.load(views[other])


def test_power_of_two_with_one_accepting_replica_takes_it() -> None:
    router = PowerOfTwoRouter()
    views = [_view(0, accepting=False), _view(1, queued=50), _view(2, accepting=False)]
    for seed in range(10):
        decision, _ = router.route(_request(), views, router.initial_state(), 0.0, np.random.default_rng(seed))
        assert decision.replica == 1


def test_power_of_two_spreads_over_accepting_replicas_but_never_the_worst() -> None:
    router = PowerOfTwoRouter()
    views = [_view(0, queued=1), _view(1, accepting=False), _view(2), _view(3, queued=2)]
    rng = np.random.default_rng(1)
    seen = [router.route(_request(), views, router.initial_state(), 0.0, rng)[0].replica for _ in range(300)]
    assert set(seen) == {0, 2}  # the draining one is never drawn, the most loaded never wins
    assert 0.2 < seen.count(0) / len(seen) < 0.5  # 0 wins only when paired with 3: 1/3 of the pairs


def test_prefix_affinity_routes_to_the_longest_match() -> None:
    router = make_router("prefix-affinity")
    state = router.initial_state()
    views = [_view(0), _view(1), _view(2)]
    first, state = router.route(_request(1, prefix=(10, 11)), views, state, 0.0, RNG)
    assert first == first.__class__(0, "least-load")  # no match yet: least-load (all equal -> id 0)
    busy0 = [_view(0, queued=1), _view(1), _view(2)]
    second, state = router.route(_request(2, prefix=(10, 11, 12, 13)), busy0, state, 1.0, RNG)
    assert second.replica == 0 and second.reason == "prefix-hit"
    # Replica 1 now serves (10, 20, 21): a prompt sharing (10, 11, 12) goes to 0, one sharing (10, 20) to 1.
    state.prefix_index.record((10, 20, 21), 1)  # type: ignore[union-attr]
    third, state = router.route(_request(3, prefix=(10, 11, 12, 99)), views, state, 2.0, RNG)
    fourth, state = router.route(_request(4, prefix=(10, 20, 98)), views, state, 3.0, RNG)
    assert (third.replica, third.reason) == (0, "prefix-hit")
    assert (fourth.replica, fourth.reason) == (1, "prefix-hit")


def test_prefix_affinity_falls_back_when_the_hit_replica_is_overloaded() -> None:
    router = make_router("prefix-affinity", guard=OverloadGuard(factor=2.0, margin=1.0))
    state = router.initial_state()
    state.prefix_index.record((1, 2, 3), 0)  # type: ignore[union-attr]
    # Replica 0 load 4 vs least 1: 4 > 2 x 1 + 1 -> fall back to replica 1, which now owns the prefix.
    views = [_view(0, queued=4), _view(1, queued=1), _view(2, queued=2)]
    decision, state = router.route(_request(prefix=(1, 2, 3)), views, state, 0.0, RNG)
    assert (decision.replica, decision.reason) == (1, "fallback-overload")
    assert state.prefix_index.lru.get(3) == 1  # type: ignore[union-attr]
    # At load 3 vs 1 (3 <= 2 x 1 + 1) the affinity holds.
    views = [_view(0, queued=1), _view(1, queued=3)]
    decision, _ = router.route(_request(prefix=(1, 2, 3)), views, state, 0.0, RNG)
    assert (decision.replica, decision.reason) == (1, "prefix-hit")


def test_prefix_affinity_forgets_gone_replicas_and_skips_draining_ones() -> None:
    router = PrefixAffinityRouter()
    state = router.initial_state()
    index = state.prefix_index
    assert index is not None
    index.record((1, 2), 5)  # replica 5 served the short prefix
    index.record((1, 2, 3), 9)  # replica 9 the long one (and now owns 1, 2 as well)
    index.record((7,), 5)
    decision, state = router.route(_request(prefix=(1, 2, 3)), [_view(5), _view(6)], state, 0.0, RNG)
    assert decision.reason == "least-load"  # 9 is gone; the shorter blocks were taken over by 9 too
    assert index.lru.get(3) == 5 and 9 not in index.lru.entries.values()
    decision, _ = router.route(_request(prefix=(7, 8)), [_view(5, accepting=False), _view(6)], state, 0.0, RNG)
    assert decision.replica == 6
    assert index.lru.get(7) == 6  # re-owned by the replica that served it


def test_session_affinity_sticks_and_moves_on_overload_or_departure() -> None:
    router = SessionAffinityRouter(guard=OverloadGuard(factor=1.5, margin=2.0))
    state = router.initial_state()
    views = [_view(0), _view(1, queued=1)]
    decision, state = router.route(_request(session=42), views, state, 0.0, RNG)
    assert (decision.replica, decision.reason) == (0, "least-load")
    views = [_view(0, queued=3), _view(1, queued=1)]  # 3 <= 1.5 x 1 + 2: still sticky
    decision, state = router.route(_request(session=42), views, state, 1.0, RNG)
    assert (decision.replica, decision.reason) == (0, "session")
    views = [_view(0, queued=4), _view(1, queued=1)]  # 4 > 3.5: move
    decision, state = router.route(_request(session=42), views, state, 2.0, RNG)
    assert (decision.replica, decision.reason) == (1, "fallback-overload")
    decision, state = router.route(_request(session=42), [_view(0), _view(1, queued=2)], state, 3.0, RNG)
    assert (decision.replica, decision.reason) == (1, "session")  # 2 <= 1.5 x 0 + 2
    decision, state = router.route(_request(session=42), [_view(0, queued=9), _view(2, queued=8)], state, 4.0, RNG)
    assert (decision.replica, decision.reason) == (2, "least-load")  # replica 1 gone
    decision, state = router.route(_request(session=-1), [_view(0), _view(2)], state, 5.0, RNG)
    assert (decision.replica, decision.reason) == (0, "least-load")
    assert state.sessions is not None and -1 not in state.sessions.entries


_views = st.lists(
    st.builds(
        ReplicaView,
        replica=st.integers(0, 12),
        queued=st.integers(0, 30),
        running=st.integers(0, 30),
        predicted_tokens=st.integers(0, 50_000),
        kv_free_frac=st.floats(0.0, 1.0),
        accepting=st.booleans(),
    ),
    max_size=6,
    unique_by=lambda view: view.replica,
)
_routes = st.lists(
    st.tuples(_views, st.lists(st.integers(0, 40), max_size=12), st.integers(-1, 15)),
    min_size=1,
    max_size=40,
)


@given(routes=_routes, cap=st.integers(1, 30), name=st.sampled_from(ROUTER_NAMES), seed=st.integers(0, 1000))
def test_routes_respect_caps_and_only_pick_present_accepting_replicas(
    routes: list[tuple[list[ReplicaView], list[int], int]], cap: int, name: str, seed: int
) -> None:
    router = make_router(name, max_prefix_entries=cap, max_sessions=cap)
    state = router.initial_state()
    rng = np.random.default_rng(seed)
    for step, (views, blocks, session) in enumerate(routes):
        prefix = tuple(blocks)
        decision, state = router.route(_request(step, prefix=prefix, session=session), views, state, float(step), rng)
        accepting = {view.replica for view in views if view.accepting}
        if accepting:
            assert decision.replica in accepting
        else:
            assert decision.replica is None
        if state.prefix_index is not None:
            assert len(state.prefix_index) <= cap
        if state.sessions is not None:
            assert len(state.sessions) <= cap
