"""Victim selection: within-queue priority, reclaim of borrowed capacity, least lost work, the no-loop rule."""

from itertools import combinations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tessera.core.errors import InvalidRequestError
from tessera.core.preemption import (
    Candidate,
    PreemptionGuard,
    PreemptionPolicy,
    admission_rank,
    candidate_rank,
    select_victims,
    select_victims_to_fit,
)
from tessera.core.queueing import QueueSpec, QuotaLedger, QuotaNeed, ResourceVector

NOW_S = 10_000.0
NO_QUOTA_NEED = QuotaNeed.none()


def gpus(n: float) -> ResourceVector:
    return ResourceVector(gpu_milli=int(n * 1000))


def cand(
    wid: str,
    queue: str = "a",
    priority: int = 100,
    *,
    size: float = 1,
    started_s: float = 0.0,
    checkpointed: bool = False,
    preemptible: bool = True,
    borrowed: bool = False,
) -> Candidate:
    return Candidate(wid, queue, priority, preemptible, started_s, checkpointed, gpus(size), borrowed)


def test_within_queue_preempts_only_strictly_lower_priority() -> None:
    running = [cand("equal", priority=500), cand("low", priority=100), cand("other-queue", "b", priority=100)]
    assert select_victims("a", 500, gpus(1), running, NOW_S, quota=NO_QUOTA_NEED) == ["low"]
    assert select_victims("a", 500, gpus(2), running, NOW_S, quota=NO_QUOTA_NEED) is None
    assert select_victims("a", 100, gpus(1), running, NOW_S, quota=NO_QUOTA_NEED) is None


def test_never_preempts_non_preemptible_work() -> None:
    running = [
        cand("serving", priority=100, preemptible=False),
        cand("borrowed", "b", preemptible=False, borrowed=True),
    ]
    assert select_victims("a", 1000, gpus(1), running, NOW_S, quota=NO_QUOTA_NEED) is None


def test_nothing_to_free_means_no_victims() -> None:
    assert select_victims("a", 500, ResourceVector.zero(), [cand("low")], NOW_S, quota=NO_QUOTA_NEED) == []


def test_reclaim_takes_only_borrowed_work_of_other_queues() -> None:
    running = [
        cand("b-own", "b", priority=1, started_s=9000),  # within b's nominal: never reclaimed
        cand("b-borrowed", "b", priority=900, borrowed=True),  # any priority may be reclaimed
    ]
    need = QuotaNeed(ResourceVector.zero(), gpus(1), gpus(1))
    assert select_victims("a", 100, gpus(1), running, NOW_S, quota=need) == ["b-borrowed"]
    assert select_victims("a", 100, gpus(2), running, NOW_S, quota=need) is None
    no_reclaim = PreemptionPolicy(reclaim=False)
    assert select_victims("a", 100, gpus(1), running, NOW_S, no_reclaim, quota=need) is None


def test_no_reclaim_while_the_preemptor_would_borrow() -> None:
    """The preemptor's queue is at its nominal quota: running would borrow, so it may not preempt anybody."""
    running = [cand("b-borrowed", "b", borrowed=True), cand("a-low-borrowed", "a", priority=1, borrowed=True)]
    need = QuotaNeed(gpus(1), ResourceVector.zero(), ResourceVector.zero())
    assert select_victims("a", 100, gpus(1), [running[0]], NOW_S, quota=need) is None
    # Shedding its own lower-priority work brings it back within nominal: allowed.
    assert select_victims("a", 100, gpus(1), running, NOW_S, quota=need) == ["a-low-borrowed"]


def test_borrowing_preemptor_only_when_enabled_and_only_borrowed_own_work() -> None:
    running = [cand("a-low", "a", priority=1, started_s=9000), cand("a-low-borrowed", "a", priority=1, borrowed=True)]
    need = QuotaNeed(gpus(1), ResourceVector.zero(), ResourceVector.zero())  # within nominal it would need 1 back
    allow = PreemptionPolicy(borrower_may_preempt=True)
    # With no own victim at all it cannot get within nominal; as a borrower it may evict only borrowed own work.
    assert select_victims("a", 100, gpus(2), running, NOW_S, quota=need) == ["a-low", "a-low-borrowed"]
    assert select_victims("a", 100, gpus(1), [running[1]], NOW_S, allow, quota=need) == ["a-low-borrowed"]
    assert (
        select_victims("a", 100, gpus(1), [running[0]], NOW_S, allow, quota=QuotaNeed(gpus(5), gpus(0), gpus(0)))
        is None
    )


def test_victims_lose_the_least_work() -> None:
    # Fewest victims first: one 2-GPU job beats two 1-GPU jobs even though they are younger and checkpointed.
    running = [
        cand("big", size=2, started_s=0),
        cand("s1", started_s=9000, checkpointed=True),
        cand("s2", started_s=9500, checkpointed=True),
    ]
    assert select_victims("a", 500, gpus(2), running, NOW_S, quota=NO_QUOTA_NEED) == ["big"]
    # Same count: checkpointed first, even when older.
    running = [cand("young", started_s=9900), cand("old-ckpt", started_s=100, checkpointed=True)]
    assert select_victims("a", 500, gpus(1), running, NOW_S, quota=NO_QUOTA_NEED) == ["old-ckpt"]
    # Same count and checkpointing: youngest first.
    running = [cand("old", started_s=100), cand("young", started_s=9900), cand("mid", started_s=5000)]
    assert select_victims("a", 500, gpus(1), running, NOW_S, quota=NO_QUOTA_NEED) == ["young"]
    assert select_victims("a", 500, gpus(2), running, NOW_S, quota=NO_QUOTA_NEED) == ["young", "mid"]


def test_greedy_fallback_and_victim_cap() -> None:
    running = [cand(f"j{i:02d}", size=0.5, started_s=float(i)) for i in range(30)]
    cheap = PreemptionPolicy(search_budget=0)
    victims = select_victims("a", 500, gpus(2), running, NOW_S, cheap, quota=NO_QUOTA_NEED)
    assert victims is not None and len(victims) == 4
    assert set(victims) == {"j29", "j28", "j27", "j26"}  # the youngest
    assert (
        select_victims("a", 500, gpus(2), running, NOW_S, PreemptionPolicy(max_victims=3), quota=NO_QUOTA_NEED) is None
    )
    with pytest.raises(InvalidRequestError):
        PreemptionPolicy(max_victims=0)


def test_guard_protects_recently_restarted_preempted_work_from_priority_but_not_from_reclaim() -> None:
    guard = PreemptionGuard(min_runtime_s=600).record(["again"])
    restarted = cand("again", priority=1, started_s=NOW_S - 60)
    assert guard.protects(restarted, NOW_S) and not guard.protects(restarted, NOW_S + 600)
    assert select_victims("a", 500, gpus(1), [restarted], NOW_S, quota=NO_QUOTA_NEED, guard=guard) is None
    assert select_victims("a", 500, gpus(1), [restarted], NOW_S + 600, quota=NO_QUOTA_NEED, guard=guard) == ["again"]
    borrowed = cand("again", "b", started_s=NOW_S - 60, borrowed=True)
    reclaim = QuotaNeed(ResourceVector.zero(), gpus(1), gpus(1))
    assert select_victims("a", 1, gpus(1), [borrowed], NOW_S, quota=reclaim, guard=guard) == ["again"]
    assert "again" not in guard.forget(["again"]).preempted
    with pytest.raises(InvalidRequestError):
        PreemptionGuard(min_runtime_s=-1)


def test_with_the_ledger_reclaim_returns_borrowed_capacity() -> None:
    ledger = QuotaLedger([QueueSpec("a", "lab", {"*": gpus(4)}), QueueSpec("b", "lab", {"*": gpus(4)})])
    for _ in range(6):
        ledger.admit("b", "*", gpus(1))  # b borrows 2 of a's idle GPUs
    assert ledger.can_admit("a", "*", gpus(3)) is None
    need = ledger.quota_need("a", "*", gpus(3))
    assert need is not None and need.cohort_deficit == gpus(1)
    running = [cand(f"b{i}", "b", started_s=float(i), borrowed=i >= 4) for i in range(6)]
    victims = select_victims("a", 100, gpus(1), running, NOW_S, quota=need)
    assert victims == ["b5"]
    ledger.release("b", "*", gpus(1))
    assert ledger.can_admit("a", "*", gpus(3)) is not None


candidates = st.lists(
    st.builds(
        Candidate,
        st.uuids().map(str),
        st.sampled_from(["a", "b", "c"]),
        st.sampled_from([100, 500, 1000]),
        st.sampled_from([True, True, True, False]),
        st.floats(0, NOW_S),
        st.booleans(),
        st.builds(ResourceVector, st.integers(0, 4).map(lambda g: g * 250), st.sampled_from([0, 1000, 4000])),
        st.booleans(),
    ),
    max_size=12,
    unique_by=lambda c: c.workload_id,
)
vectors = st.one_of(
    st.just(ResourceVector.zero()),
    st.builds(ResourceVector, st.integers(0, 8).map(lambda g: g * 250), st.sampled_from([0, 0, 1000, 6000])),
)


def allowed_by_rule(
    chosen: list[Candidate], priority: int, needed: ResourceVector, quota: QuotaNeed, borrower: bool
) -> tuple[bool, bool]:
    """(allowed, preemptor within nominal): the rule of tessera.core.preemption, written out independently."""
    own = [c for c in chosen if c.queue == "a"]
    others = [c for c in chosen if c.queue != "a"]
    freed = sum((c.frees for c in chosen), ResourceVector.zero())
    own_freed = sum((c.frees for c in own), ResourceVector.zero())
    if not (needed <= freed and all(c.preemptible for c in chosen)):
        return False, False
    own_ok = all(c.priority < priority for c in own)
    case1 = own_ok and all(c.borrowed for c in others)
    case1 = case1 and quota.nominal_shortfall <= own_freed and quota.cohort_deficit <= freed - own_freed
    case2 = borrower and quota.borrow_excess is not None and quota.borrow_excess <= freed
    case2 = case2 and not others and own_ok and all(c.borrowed for c in own)
    return case1 or case2, case1


@settings(max_examples=500, deadline=None)
@given(candidates, st.sampled_from([100, 500, 1000, 1000]), vectors, vectors, vectors, st.booleans())
def test_every_victim_ranks_strictly_below_the_preemptor(
    running: list[Candidate],
    priority: int,
    needed: ResourceVector,
    shortfall: ResourceVector,
    deficit: ResourceVector,
    borrower: bool,
) -> None:
    """The no-loop rule: rank(preemptor as admitted) > rank(victim) for every victim, and enough is freed."""
    quota = QuotaNeed(shortfall, deficit, shortfall)
    victims = select_victims(
        "a", priority, needed, running, NOW_S, PreemptionPolicy(borrower_may_preempt=borrower), quota=quota
    )
    smallest = None
    if len(running) <= 8:  # brute force: the fewest victims any allowed set needs
        sizes = [
            size
            for size in range(len(running) + 1)
            for subset in combinations(running, size)
            if allowed_by_rule(list(subset), priority, needed, quota, borrower)[0]
        ]
        smallest = min(sizes, default=None)
        assert (victims is None) == (smallest is None)
    if victims is None:
        return
    chosen = [c for c in running if c.workload_id in victims]
    assert len(chosen) == len(victims)
    if smallest is not None:
        assert len(victims) == smallest
    allowed, within_nominal = allowed_by_rule(chosen, priority, needed, quota, borrower)
    assert allowed
    preemptor_rank = admission_rank(within_nominal, priority)
    assert all(candidate_rank(c) < preemptor_rank for c in chosen)


# ------------------------------------------------------------------------------------- victims that make room to fit


def test_to_fit_grows_the_set_until_the_oracle_says_it_fits_and_drops_victims_not_needed() -> None:
    # Only "w1" and "w2" together free a place where the preemptor fits; "x" is cheaper but frees the wrong GPU.
    running = [cand("x", priority=1, started_s=9_000.0), cand("w1", priority=1), cand("w2", priority=1)]
    asked: list[set[str]] = []

    def fits(victims: object) -> bool:
        ids = {c.workload_id for c in victims}  # type: ignore[attr-defined]
        asked.append(ids)
        return {"w1", "w2"} <= ids

    def usefulness(c: Candidate, chosen: object) -> float:
        return 0.5 if c.workload_id.startswith("w") else 0.0

    found = select_victims_to_fit("a", 100, running, NOW_S, quota=NO_QUOTA_NEED, fits=fits, usefulness=usefulness)
    assert found is not None and sorted(found) == ["w1", "w2"]


def test_to_fit_gives_up_when_even_every_allowed_victim_does_not_make_room() -> None:
    running = [cand("low", priority=1), cand("equal", priority=100), cand("other", "b", priority=1)]
    tried: list[set[str]] = []

    def fits(victims: object) -> bool:
        tried.append({c.workload_id for c in victims})  # type: ignore[attr-defined]
        return False

    found = select_victims_to_fit(
        "a", 100, running, NOW_S, quota=NO_QUOTA_NEED, fits=fits, usefulness=lambda c, chosen: 1.0
    )
    assert found is None
    assert tried == [{"low"}]  # one look at the whole allowed pool; "equal" and "other" are never allowed
