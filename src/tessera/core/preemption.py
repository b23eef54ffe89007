"""Preemption: which running workloads to stop so that a pending one can run, under a rule that prevents loops.

The scheduler calls ``select_victims`` when a pending workload (the *preemptor*) cannot be admitted on a node or
within its quota. Two kinds of preemption exist, in Kueue's words:

- **within a queue, by priority**: victims of the preemptor's own queue with strictly lower priority;
- **reclaim**: victims of other queues of the cohort that run on borrowed capacity, when the preemptor's queue
  takes back its own nominal quota (its admission then borrows nothing).

Non-preemptible workloads are never victims (and the scheduler never lets them borrow: ``PendingWorkload.
preemptible``). Among the victim sets that free enough, the one that loses the least work wins: fewest victims,
then most checkpointed, then youngest (least run time lost), then ids. Amounts freed do not always make room where the
preemptor fits (whole GPUs, nodes): ``select_victims_to_fit`` then grows a set from the same allowed victims,
asking the caller's placement oracle, and drops the victims not needed. Either way every victim is one the rule
below allows, so the number of victims never affects the proof.

**The no-loop rule.** Every admission has a rank ``(within_nominal, priority)``, fixed when it is admitted:
``within_nominal`` is 1 when its admission borrowed nothing (``Admission.borrowed`` zero), else 0. A preemptor
may evict a victim only when its own rank (as it will be admitted once the victims are gone) is lexicographically
*strictly greater* than the victim's. ``select_victims`` enforces it through these cases, and no others:

1. preemptor within nominal (own-queue victims free its ``nominal_shortfall``): own-queue victims of strictly lower
   priority, rank (·, lower) < (1, p); other-queue victims admitted by borrowing, rank (0, ·) < (1, ·);
2. preemptor borrowing (only with ``PreemptionPolicy.borrower_may_preempt``, off by default, so by default a
   workload that would be admitted by borrowing never preempts): own-queue victims admitted by borrowing with
   strictly lower priority, rank (0, lower) < (0, p).

*Proof sketch.* Let Φ be the vector, over ranks from highest to lowest, of how many running workloads were admitted
at each rank. An admission adds one workload at rank r and, when it preempts, removes only workloads of rank < r, so
Φ strictly increases in lexicographic order. Between external events (arrivals, completions, quota changes) the
workloads are a fixed finite set and ranks take finitely many values, so Φ has finitely many values: only finitely
many admissions, hence preemptions, can follow, and no sequence of preemptions can return to an earlier state (a
loop would repeat a value of Φ). The proof needs ``Candidate.borrowed`` to be True only for workloads admitted by
borrowing (a caller may narrow it, e.g. to queues above nominal now) and ``frees`` to be at most what the victim's
queue is charged for it, so that the preemptor's real admission is never ranked below what was assumed here.

``PreemptionGuard`` adds a time bound against churn from outside events: a workload preempted once may not be
preempted by priority again until it has run ``min_runtime_s`` since its restart (seconds compared with ``now_s``).
Reclaim ignores the guard: nominal quota is a guarantee, returned within one scheduling step. Under LAS within
classes the step gives the guard the class spread (``queueing.las.class_guard``): it then holds back only preemptors
of the victim's own priority class (LAS churn), never a strictly higher class, except for a run bound in this very
instant (``started_s == now_s``: an earlier step of the instant bound it, and the runtime may not have launched it).

Ties are broken alike in every runtime (the simulator and the server must decide the same: tests/server/
test_same_decisions.py): run time lost is compared to the microsecond (clock origins differ, so do their rounding
errors), and ids by number where they are numbers (``id_order``), not as text.

Pure: candidates and quota needs come in (``QuotaLedger.quota_need``), victim ids go out; nothing is changed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from itertools import combinations
from math import comb

from tessera.core.errors import InvalidRequestError
from tessera.core.queueing.quotas import QuotaNeed
from tessera.core.queueing.resources import ResourceVector


@dataclass(frozen=True, slots=True)
class Candidate:
    workload_id: str
    queue: str
    priority: int
    preemptible: bool
    started_s: float  # when it (re)started running
    checkpointed: bool  # a restart resumes from a checkpoint: little work is lost
    frees: ResourceVector  # what stopping it frees on the node under consideration (<= its quota charge)
    borrowed: bool  # admitted on capacity borrowed from another queue (Admission.is_borrowing)


@dataclass(frozen=True, slots=True)
class PreemptionPolicy:
    within_queue: bool = True  # preempt lower-priority work of the preemptor's own queue
    reclaim: bool = True  # preempt other queues' borrowed work to take back nominal quota
    borrower_may_preempt: bool = False  # rule case 2: a borrowing preemptor may evict its queue's borrowed work
    max_victims: int = 16  # never evict more than this for one preemptor
    search_budget: int = 20_000  # victim sets examined exactly before a greedy choice takes over

    def __post_init__(self) -> None:
        if self.max_victims < 1:
            raise InvalidRequestError("max_victims", f"must be >= 1, got {self.max_victims}")
        if self.search_budget < 0:
            raise InvalidRequestError("search_budget", f"must be >= 0, got {self.search_budget}")


@dataclass(frozen=True, slots=True)
class PreemptionGuard:
    """Workloads preempted before, and how long they must run after a restart before priority may preempt them.

    ``class_spread`` (LAS within classes; ``QuotaStep`` sets it): priorities are ``class * spread + LAS level``, and
    the guard holds back only preemptors of the victim's own class (``priority_class``). A strictly higher class
    preempts a guarded run at once, unless that run started at ``now_s`` (bound earlier in this very instant: the
    runtime has not even launched it, and a step must never undo what the instant's earlier step decided)."""

    min_runtime_s: float = 600.0
    preempted: frozenset[str] = frozenset()
    class_spread: int | None = None

    def __post_init__(self) -> None:
        if self.min_runtime_s < 0:
            raise InvalidRequestError("min_runtime_s", f"must be >= 0, got {self.min_runtime_s}")
        if self.class_spread is not None and self.class_spread < 1:
            raise InvalidRequestError("class_spread", f"must be >= 1, got {self.class_spread}")

    def protects(self, candidate: Candidate, now_s: float, preemptor_priority: int | None = None) -> bool:
        """Whether priority may not preempt ``candidate`` at ``now_s`` (for a preemptor of ``preemptor_priority``;
        None: any preemptor)."""
        if candidate.workload_id not in self.preempted:
            return False
        if self.class_spread is not None and preemptor_priority is not None and candidate.started_s < now_s:
            spread = self.class_spread
            if priority_class(candidate.priority, spread) < priority_class(preemptor_priority, spread):
                return False  # a strictly higher class, and the run did not start in this very instant
        return now_s - candidate.started_s < self.min_runtime_s

    def record(self, workload_ids: Iterable[str]) -> PreemptionGuard:
        """The guard after ``workload_ids`` were preempted."""
        return dataclasses.replace(self, preempted=self.preempted | frozenset(workload_ids))

    def forget(self, workload_ids: Iterable[str]) -> PreemptionGuard:
        """The guard after ``workload_ids`` finished (they need no protection any more)."""
        return dataclasses.replace(self, preempted=self.preempted - frozenset(workload_ids))


def priority_class(priority: int, spread: int) -> int:
    """The priority class of a priority ``class * spread + level`` with ``-spread < level <= 0`` (LAS within
    classes: ``LasService.priority``): the class, since the level only lowers it by less than ``spread``."""
    return -(-priority // spread)


def admission_rank(within_nominal: bool, priority: int) -> tuple[int, int]:
    """The rank of an admission in the no-loop rule: a preemptor's rank must exceed every victim's."""
    return (int(within_nominal), priority)


def candidate_rank(candidate: Candidate) -> tuple[int, int]:
    return admission_rank(not candidate.borrowed, candidate.priority)


# A requirement: a target amount and which victims count towards it ("all", "own" or "other").
_Requirement = tuple[ResourceVector, str]
_Cost = tuple[int, int, float, tuple[tuple[int, int, str], ...]]
LOST_DIGITS = 6  # victim sets' lost run time is compared to the microsecond (``_cost_fn``)


@dataclass(frozen=True, slots=True)
class _Mode:
    """One case of the rule: which candidates may be victims and what they must free together."""

    queue: str  # the preemptor's queue
    pool: tuple[Candidate, ...]
    requirements: tuple[_Requirement, ...]
    ids: frozenset[str] = frozenset()  # of the pool (set after init)

    def __post_init__(self) -> None:
        object.__setattr__(self, "ids", frozenset(c.workload_id for c in self.pool))

    def allows(self, victims: Sequence[Candidate]) -> bool:
        return all(c.workload_id in self.ids for c in victims) and self.feasible(victims)

    def feasible(self, victims: Sequence[Candidate]) -> bool:
        return all(target <= self.freed(victims, scope) for target, scope in self.requirements)

    def freed(self, victims: Sequence[Candidate], scope: str) -> ResourceVector:
        total = ResourceVector.zero()
        for c in victims:
            if scope == "all" or (scope == "own") == (c.queue == self.queue):
                total = total + c.frees
        return total

    def gain(self, c: Candidate, chosen: Sequence[Candidate]) -> float:
        """How much of what ``chosen`` still misses ``c`` would cover, as fractions of each target."""
        gain = 0.0
        for target, scope in self.requirements:
            if self.freed([c], scope).is_zero():
                continue
            gap = target - self.freed(chosen, scope)
            for need, total, have in (
                (gap.gpu_milli, target.gpu_milli, c.frees.gpu_milli),
                (gap.cpu_milli, target.cpu_milli, c.frees.cpu_milli),
                (gap.mem_mib, target.mem_mib, c.frees.mem_mib),
            ):
                if need > 0:
                    gain += min(have, need) / total
        return gain


def select_victims(
    preemptor_queue: str,
    preemptor_priority: int,
    needed: ResourceVector,
    candidates: Sequence[Candidate],
    now_s: float,
    policy: PreemptionPolicy | None = None,
    *,
    quota: QuotaNeed,
    guard: PreemptionGuard | None = None,
) -> list[str] | None:
    """Ids of the running workloads to preempt so that the preemptor can run, or None when no allowed set frees
    ``needed`` on the node and the preemptor's ``quota`` need (``QuotaLedger.quota_need``). ``[]`` when nothing
    needs freeing. Candidates of other queues must be of the preemptor's cohort and flavor pool (the caller
    filters). ``policy`` defaults to ``PreemptionPolicy()``; without a ``guard`` nothing is protected.

    Quota is counted with ``frees``, which is exact for single-node victims whose queue stays above its guaranteed
    quota; before applying, release the victims on ``QuotaLedger.copy()`` and confirm ``can_admit``."""
    policy = policy or PreemptionPolicy()
    modes = _modes(preemptor_queue, preemptor_priority, needed, candidates, now_s, policy, quota, guard)
    if any(m.feasible(()) for m in modes):
        return []
    modes = [m for m in modes if m.feasible(m.pool)]  # feasibility is monotone: if not the whole pool, nothing
    if not modes:
        return None
    cost = _cost_fn(now_s)
    eligible = sorted({c.workload_id: c for m in modes for c in m.pool}.values(), key=_preference)
    best = _exact_search(eligible, modes, policy.max_victims, policy.search_budget, cost)
    if best is None:
        best = min((_greedy(m) for m in modes), key=cost)
    if len(best) > policy.max_victims:
        return None
    return [c.workload_id for c in sorted(best, key=_preference)]


def select_victims_to_fit(
    preemptor_queue: str,
    preemptor_priority: int,
    candidates: Sequence[Candidate],
    now_s: float,
    policy: PreemptionPolicy | None = None,
    *,
    quota: QuotaNeed,
    guard: PreemptionGuard | None = None,
    fits: Callable[[Sequence[Candidate]], bool],
    usefulness: Callable[[Candidate, Sequence[Candidate]], float],
) -> list[str] | None:
    """Like ``select_victims``, from the same allowed candidates (the no-loop rule is the same), for when amounts
    are not enough: the freed capacity must also be where the preemptor fits (whole GPUs, one node per worker).
    ``fits(victims)`` says whether the preemptor can be placed once ``victims`` are stopped; ``usefulness(c,
    chosen)`` (>= 0) how much stopping ``c`` as well would help it fit. Greedy: add the candidate that covers most
    of the quota still missing plus its usefulness until the quota need is met and ``fits`` holds, then drop every
    victim not needed (most expensive first). None when no set of at most ``max_victims`` is found."""
    policy = policy or PreemptionPolicy()
    zero = ResourceVector.zero()
    found = []
    for mode in _modes(preemptor_queue, preemptor_priority, zero, candidates, now_s, policy, quota, guard):
        chosen = _grow_until_fit(mode, policy.max_victims, fits, usefulness)
        if chosen is not None:
            found.append(chosen)
    if not found:
        return None
    best = min(found, key=_cost_fn(now_s))
    return [c.workload_id for c in sorted(best, key=_preference)]


def _modes(
    preemptor_queue: str,
    preemptor_priority: int,
    needed: ResourceVector,
    candidates: Sequence[Candidate],
    now_s: float,
    policy: PreemptionPolicy,
    quota: QuotaNeed,
    guard: PreemptionGuard | None,
) -> list[_Mode]:
    """The cases of the no-loop rule (module docstring) that apply: who may be a victim, what must be freed."""
    guard = guard if guard is not None else PreemptionGuard(min_runtime_s=0.0)
    own = [
        c
        for c in candidates
        if policy.within_queue
        and c.queue == preemptor_queue
        and c.preemptible
        and c.priority < preemptor_priority
        and not guard.protects(c, now_s, preemptor_priority)
    ]
    other = [c for c in candidates if policy.reclaim and c.queue != preemptor_queue and c.preemptible and c.borrowed]
    requirements = ((needed, "all"), (quota.nominal_shortfall, "own"), (quota.cohort_deficit, "other"))
    modes = [_Mode(preemptor_queue, tuple(own + other), requirements)]
    if policy.borrower_may_preempt and quota.borrow_excess is not None:
        borrowed_own = tuple(c for c in own if c.borrowed)
        modes.append(_Mode(preemptor_queue, borrowed_own, ((needed, "all"), (quota.borrow_excess, "all"))))
    return modes


def _grow_until_fit(
    mode: _Mode,
    max_victims: int,
    fits: Callable[[Sequence[Candidate]], bool],
    usefulness: Callable[[Candidate, Sequence[Candidate]], float],
) -> list[Candidate] | None:
    if not (mode.feasible(mode.pool) and fits(mode.pool)):
        return None  # not even every allowed victim together makes room: no subset does
    chosen: list[Candidate] = []
    left = sorted(mode.pool, key=_preference)
    while not (mode.feasible(chosen) and fits(chosen)):
        if not left or len(chosen) >= max_victims:
            return None
        gains = [(mode.gain(c, chosen) + usefulness(c, chosen), -k) for k, c in enumerate(left)]
        best = max(range(len(left)), key=lambda k: gains[k])
        if gains[best][0] <= 0:
            return None  # nothing left helps
        chosen.append(left.pop(best))
    for victim in sorted(chosen, key=_preference, reverse=True):
        rest = [c for c in chosen if c is not victim]
        if mode.feasible(rest) and fits(rest):
            chosen = rest
    return chosen


def id_order(workload_id: str) -> tuple[int, int, str]:
    """The order of workload ids in ties: numbered ids by number, before any other id (then by text).

    Every runtime numbers its workloads in the order they arrive (the simulator by trace index from 0, the server by
    row id from 1), so numeric order is the same in both, but text order is not: the same two jobs are "3" and "9"
    in one and "4" and "10" in the other, and "10" < "4" as text. Victims tied on cost and chosen by text order
    differed between the simulator and the server (tests/server/test_same_decisions.py)."""
    if workload_id.isascii() and workload_id.isdigit():
        return (0, int(workload_id), "")
    return (1, 0, workload_id)


def _preference(c: Candidate) -> tuple[bool, float, tuple[int, int, str]]:
    """Cheapest victim first: checkpointed, then youngest (latest start), then id (``id_order``)."""
    return (not c.checkpointed, -c.started_s, id_order(c.workload_id))


def _cost_fn(now_s: float) -> Callable[[Sequence[Candidate]], _Cost]:
    def cost(victims: Sequence[Candidate]) -> _Cost:
        # Rounded to the microsecond: run times come from differences of clock readings, which carry rounding noise
        # that depends on the clock's origin (the server's epoch seconds, the simulator's zero); sets that lose the
        # same work must tie in every runtime, and then the ids decide.
        lost = round(sum(max(now_s - c.started_s, 0.0) for c in victims), LOST_DIGITS)
        unsaved = sum(1 for c in victims if not c.checkpointed)
        return (len(victims), unsaved, lost, tuple(sorted(id_order(c.workload_id) for c in victims)))

    return cost


def _exact_search(
    eligible: list[Candidate],
    modes: list[_Mode],
    max_victims: int,
    budget: int,
    cost: Callable[[Sequence[Candidate]], _Cost],
) -> list[Candidate] | None:
    """The cheapest allowed set, trying sizes 1, 2, ... while the number of sets stays within the budget."""
    for size in range(1, min(max_victims, len(eligible)) + 1):
        sets = comb(len(eligible), size)
        if sets > budget:
            return None
        budget -= sets
        found: list[Candidate] | None = None
        for victims in combinations(eligible, size):
            if any(m.allows(victims) for m in modes) and (found is None or cost(victims) < cost(found)):
                found = list(victims)
        if found is not None:
            return found
    return None


def _greedy(mode: _Mode) -> list[Candidate]:
    """Add the victim that covers most of what is still missing until enough is freed, then drop every victim the
    set does not need (most expensive first). The mode's whole pool is known to be feasible."""
    chosen: list[Candidate] = []
    left = sorted(mode.pool, key=_preference)
    while not mode.feasible(chosen):
        best = max(enumerate(left), key=lambda item: (mode.gain(item[1], chosen), -item[0]))[1]
        chosen.append(best)
        left.remove(best)
    for victim in sorted(chosen, key=_preference, reverse=True):
        rest = [c for c in chosen if c is not victim]
        if mode.feasible(rest):
            chosen = rest
    return sorted(chosen, key=_preference)
