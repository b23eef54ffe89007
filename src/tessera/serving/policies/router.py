"""Routers: which ready replica of a model serves the next request.

The gateway and the serving twin call ``route`` once per request (millions of times in a replay), so every router
is O(replicas) per call, allocates nothing but its decision, and keeps its memory in a ``RouterState`` the caller
owns: one per model (the round-robin cursor, the prefix index and the session table are per model; a replica of
another model never appears in the views). ``route`` updates the state in place and returns the same object.

Load (least-load, power-of-two, and the overload guard): ``LoadWeights`` documents the weighting,
``queued + running + predicted_tokens / tokens_per_unit``: a request waiting or running claims a batch slot and
KV blocks whatever its size, and the tokens left say how long the replica stays busy. With the default 1,024 tokens
per unit one unit of token work is about one request of the Azure conversation trace (prompts average ~1,155
tokens, outputs ~211). Ties go to the replica with more free KV cache, then the lowest replica id (deterministic,
whatever the order of the views). ``token-jsq`` counts a replica's queue in tokens instead (``TokenJsqRouter``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from tessera.serving.policies.prefix_index import CappedLru, PrefixIndex, find_replica
from tessera.serving.policies.requests import InferenceRequest


@dataclass(frozen=True, slots=True)
class ReplicaView:
    """What a router sees of one ready replica of the request's model."""

    replica: int  # replica id
    queued: int  # waiting in the engine (not yet running)
    running: int  # in the running batch
    predicted_tokens: int  # work left: prompt tokens still to prefill + predicted decode tokens left
    kv_free_frac: float  # free KV-cache fraction in [0, 1]
    accepting: bool = True  # False while draining
    prefill_tokens: int = 0  # prompt tokens still to prefill, waiting or mid-prefill (token-jsq's queue)


@dataclass(frozen=True, slots=True)
class RouteDecision:
    replica: int | None  # None when no replica accepts
    reason: str  # "round-robin", "least-load", "power-of-two", "prefix-hit", "session", "fallback-overload", ...


NO_REPLICA = RouteDecision(None, "no-replica")


@dataclass(frozen=True, slots=True)
class LoadWeights:
    """load = queued_weight x queued + running_weight x running + predicted_tokens / tokens_per_unit."""

    queued_weight: float = 1.0
    running_weight: float = 1.0
    tokens_per_unit: float = 1024.0

    def __post_init__(self) -> None:
        if self.queued_weight < 0 or self.running_weight < 0 or self.tokens_per_unit <= 0:
            raise ValueError(f"load weights must be >= 0 and tokens_per_unit > 0: {self}")

    def load(self, view: ReplicaView) -> float:
        return (
            self.queued_weight * view.queued
            + self.running_weight * view.running
            + view.predicted_tokens / self.tokens_per_unit
        )


@dataclass(frozen=True, slots=True)
class OverloadGuard:
    """Affinity yields to least-load when the preferred replica's load > factor x least load + margin: a hot prefix
    or a chatty session must not pile onto one replica while others idle. The margin keeps light loads sticky (at
    load 0 vs 1 the factor alone would always fall back)."""

    factor: float = 2.0
    margin: float = 4.0

    def __post_init__(self) -> None:
        if self.factor < 1.0 or self.margin < 0:
            raise ValueError(f"overload guard needs factor >= 1 and margin >= 0: {self}")

    def overloaded(self, preferred_load: float, least_load: float) -> bool:
        return preferred_load > self.factor * least_load + self.margin


@dataclass(slots=True)
class RouterState:
    """Mutable per-model router memory, owned by the caller; ``route`` updates it in place and returns it."""

    last_replica: int = -1  # round-robin: the replica id served last
    prefix_index: PrefixIndex | None = None  # prefix-affinity only
    sessions: CappedLru | None = None  # session-affinity only


class Router(Protocol):
    @property
    def name(self) -> str: ...

    def initial_state(self) -> RouterState: ...

    def route(
        self,
        request: InferenceRequest,
        replicas: Sequence[ReplicaView],
        state: RouterState,
        now_s: float,
        rng: np.random.Generator,
    ) -> tuple[RouteDecision, RouterState]: ...


def _better(a: ReplicaView, load_a: float, b: ReplicaView, load_b: float) -> bool:
    """Whether ``a`` is strictly preferable to ``b``: less load, then more free KV cache, then the lower id."""
    if load_a != load_b:
        return load_a < load_b
    if a.kv_free_frac != b.kv_free_frac:
        return a.kv_free_frac > b.kv_free_frac
    return a.replica < b.replica


def least_loaded(replicas: Sequence[ReplicaView], weights: LoadWeights) -> tuple[int, float]:
    """(position, load) of the least-loaded accepting replica, or (-1, inf) when none accepts."""
    best, best_load = -1, float("inf")
    for position, view in enumerate(replicas):
        if not view.accepting:
            continue
        load = weights.load(view)
        if best < 0 or _better(view, load, replicas[best], best_load):
            best, best_load = position, load
    return best, best_load


@dataclass(frozen=True, slots=True)
class RoundRobinRouter:
    """Accepting replicas in turn, by replica id (stable when replicas come and go): the next id after the last."""

    name: str = "round-robin"

    def initial_state(self) -> RouterState:
        return RouterState()

    def route(
        self,
        request: InferenceRequest,
        replicas: Sequence[ReplicaView],
        state: RouterState,
        now_s: float,
        rng: np.random.Generator,
    ) -> tuple[RouteDecision, RouterState]:
        last = state.last_replica
        after: int | None = None  # the smallest id above the last one
        lowest: int | None = None  # wrap-around: the smallest id of all
        for view in replicas:
            if not view.accepting:
                continue
            rid = view.replica
            if lowest is None or rid < lowest:
                lowest = rid
            if rid > last and (after is None or rid < after):
                after = rid
        chosen = after if after is not None else lowest
        if chosen is None:
            return NO_REPLICA, state
        state.last_replica = chosen
        return RouteDecision(chosen, "round-robin"), state


@dataclass(frozen=True, slots=True)
class LeastLoadRouter:
    """The accepting replica with the least load (``LoadWeights``)."""

    weights: LoadWeights = LoadWeights()
    name: str = "least-load"

    def initial_state(self) -> RouterState:
        return RouterState()

    def route(
        self,
        request: InferenceRequest,
        replicas: Sequence[ReplicaView],
        state: RouterState,
        now_s: float,
        rng: np.random.Generator,
    ) -> tuple[RouteDecision, RouterState]:
        position, _ = least_loaded(replicas, self.weights)
        if position < 0:
            return NO_REPLICA, state
        return RouteDecision(replicas[position].replica, "least-load"), state


def _nth_accepting(replicas: Sequence[ReplicaView], n: int) -> int:
    """Position of the n-th accepting replica (0-based)."""
    for position, view in enumerate(replicas):
        if view.accepting:
            if n == 0:
                return position
            n -= 1
    raise IndexError("fewer accepting replicas than asked")


@dataclass(frozen=True, slots=True)
class PowerOfTwoRouter:
    """Two distinct accepting replicas drawn at random; the less loaded of the two (Mitzenmacher's power of two
    choices: nearly least-load balance from two looks, and no herd onto one replica when loads are stale)."""

    weights: LoadWeights = LoadWeights()
    name: str = "power-of-two"

    def initial_state(self) -> RouterState:
        return RouterState()

    def route(
        self,
        request: InferenceRequest,
        replicas: Sequence[ReplicaView],
        state: RouterState,
        now_s: float,
        rng: np.random.Generator,
    ) -> tuple[RouteDecision, RouterState]:
        count = sum(1 for view in replicas if view.accepting)
        if count == 0:
            return NO_REPLICA, state
        if count == 1:
            return RouteDecision(replicas[_nth_accepting(replicas, 0)].replica, "power-of-two"), state
        first = min(int(rng.random() * count), count - 1)
        second = min(int(rng.random() * (count - 1)), count - 2)
        if second >= first:
            second += 1  # distinct from the first
        if count < len(replicas):
            a, b = replicas[_nth_accepting(replicas, first)], replicas[_nth_accepting(replicas, second)]
        else:
            a, b = replicas[first], replicas[second]
        weights = self.weights
        chosen = a if _better(a, weights.load(a), b, weights.load(b)) else b
        return RouteDecision(chosen.replica, "power-of-two"), state


def _affine_or_least(
    replicas: Sequence[ReplicaView],
    preferred: int,
    weights: LoadWeights,
    guard: OverloadGuard,
    hit_reason: str,
) -> RouteDecision:
    """The preferred position unless the guard says it is overloaded; least-load otherwise (or with no
    preference, ``preferred`` < 0)."""
    least, least_load = least_loaded(replicas, weights)
    if least < 0:
        return NO_REPLICA
    if preferred < 0:
        return RouteDecision(replicas[least].replica, "least-load")
    if guard.overloaded(weights.load(replicas[preferred]), least_load):
        return RouteDecision(replicas[least].replica, "fallback-overload")
    return RouteDecision(replicas[preferred].replica, hit_reason)


@dataclass(frozen=True, slots=True)
class PrefixAffinityRouter:
    """The replica that last served the longest prefix of the prompt (its prefix cache likely still holds it),
    guarded against overload; least-load without a match. The chosen replica becomes the owner of all the
    request's prefix blocks. O(prefix blocks + replicas) per route."""

    max_prefix_entries: int = 200_000  # ~16 bytes of payload each in a dict: a few tens of MB at most
    weights: LoadWeights = LoadWeights()
    guard: OverloadGuard = OverloadGuard()
    name: str = "prefix-affinity"

    def initial_state(self) -> RouterState:
        return RouterState(prefix_index=PrefixIndex.with_cap(self.max_prefix_entries))

    def route(
        self,
        request: InferenceRequest,
        replicas: Sequence[ReplicaView],
        state: RouterState,
        now_s: float,
        rng: np.random.Generator,
    ) -> tuple[RouteDecision, RouterState]:
        index = state.prefix_index
        if index is None:
            index = state.prefix_index = PrefixIndex.with_cap(self.max_prefix_entries)
        preferred, _ = index.longest_match(request.prefix, replicas) if request.prefix else (-1, 0)
        decision = _affine_or_least(replicas, preferred, self.weights, self.guard, "prefix-hit")
        if decision.replica is not None and request.prefix:
            index.record(request.prefix, decision.replica)
        return decision, state


@dataclass(frozen=True, slots=True)
class SessionAffinityRouter:
    """Sticky by ``request.session`` (a conversation's turns share their history, so the replica that served the
    last turn holds it in its prefix cache); guarded against overload; least-load for requests without a session
    (-1) and for a session's first request. The session table is a capped LRU map."""

    max_sessions: int = 100_000
    weights: LoadWeights = LoadWeights()
    guard: OverloadGuard = OverloadGuard()
    name: str = "session-affinity"

    def initial_state(self) -> RouterState:
        return RouterState(sessions=CappedLru(self.max_sessions))

    def route(
        self,
        request: InferenceRequest,
        replicas: Sequence[ReplicaView],
        state: RouterState,
        now_s: float,
        rng: np.random.Generator,
    ) -> tuple[RouteDecision, RouterState]:
        sessions = state.sessions
        if sessions is None:
            sessions = state.sessions = CappedLru(self.max_sessions)
        session = request.session
        preferred = -1
        if session >= 0:
            owner = sessions.get(session)
            if owner is not None:
                preferred = find_replica(replicas, owner)
                if preferred < 0:
                    sessions.forget(session)  # its replica is gone
                elif not replicas[preferred].accepting:
                    preferred = -1  # draining: move the session
        decision = _affine_or_least(replicas, preferred, self.weights, self.guard, "session")
        if decision.replica is not None and session >= 0:
            sessions.put(session, decision.replica)
        return decision, state


@dataclass(frozen=True, slots=True)
class TokenJsqRouter:
    """Join the shortest queue counted in tokens, as the Splitwise simulator's ``token_jsq`` global scheduler does:
    the accepting replica with the fewest prompt tokens still to prefill plus one per unfinished request
    (``prefill_tokens + queued + running``), blind to output lengths; ties to the lowest replica id."""

    name: str = "token-jsq"

    def initial_state(self) -> RouterState:
        return RouterState()

    def route(
        self,
        request: InferenceRequest,
        replicas: Sequence[ReplicaView],
        state: RouterState,
        now_s: float,
        rng: np.random.Generator,
    ) -> tuple[RouteDecision, RouterState]:
        best: ReplicaView | None = None
        best_tokens = 0
        for view in replicas:
            if not view.accepting:
                continue
            tokens = view.prefill_tokens + view.queued + view.running
            if best is None or tokens < best_tokens or (tokens == best_tokens and view.replica < best.replica):
                best, best_tokens = view, tokens
        if best is None:
            return NO_REPLICA, state
        return RouteDecision(best.replica, "token-jsq"), state


ROUTER_NAMES: tuple[str, ...] = (
    "round-robin",
    "least-load",
    "power-of-two",
    "prefix-affinity",
    "session-affinity",
    "token-jsq",
)


def make_router(
    name: str,
    *,
    weights: LoadWeights = LoadWeights(),
    guard: OverloadGuard = OverloadGuard(),
    max_prefix_entries: int = 200_000,
    max_sessions: int = 100_000,
) -> Router:
    """The router called ``name`` (one of ``ROUTER_NAMES``); options a router does not use are ignored."""
    key = name.strip().lower()
    if key == "round-robin":
        return RoundRobinRouter()
    if key == "least-load":
        return LeastLoadRouter(weights)
    if key == "power-of-two":
        return PowerOfTwoRouter(weights)
    if key == "prefix-affinity":
        return PrefixAffinityRouter(max_prefix_entries, weights, guard)
    if key == "session-affinity":
        return SessionAffinityRouter(max_sessions, weights, guard)
    if key == "token-jsq":
        return TokenJsqRouter()
    raise ValueError(f"unknown router {name!r} (known: {', '.join(ROUTER_NAMES)})")
