"""Hypothesis: random queues in cohorts and random admit/release sequences keep every quota rule.

The oracle checks the rules in Kueue's own form, independently of the ledger's slack arithmetic: with guaranteed
quota g = N - lending_limit (0 when unlimited), a pool is balanced when sum((u - g)+) <= sum(min(lending_limit, N)).
"""

from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from tessera.core.queueing import QueueSpec, QuotaLedger, ResourceVector

FLAVOR_KEYS = ("*", "T4", "A100-80GB")
DEMAND_MODELS = ("T4", "A100-80GB", "L4")
BIG = 10**9

amounts = st.builds(ResourceVector, st.integers(0, 8).map(lambda g: g * 500), st.integers(0, 4000), st.integers(0, 64))
demands = st.builds(ResourceVector, st.integers(0, 4).map(lambda g: g * 500), st.integers(0, 1500), st.integers(0, 24))


@st.composite
def queue_specs(draw: st.DrawFn) -> list[QueueSpec]:
    specs = []
    for i in range(draw(st.integers(1, 4))):
        cohort = draw(st.sampled_from([None, "c1", "c1", "c2"]))
        keys = draw(st.lists(st.sampled_from(FLAVOR_KEYS), min_size=1, max_size=3, unique=True))
        nominal = {k: draw(amounts) for k in keys}

        limits = [
            {k: draw(amounts) for k in keys if draw(st.booleans())} if cohort and draw(st.booleans()) else None
            for _ in range(2)
        ]
        specs.append(QueueSpec(f"q{i}", cohort, nominal, limits[0], limits[1]))
    return specs


@dataclass
class Held:
    queue: str
    model: str
    demand: ResourceVector


def components(v: ResourceVector) -> tuple[int, int, int]:
    return (v.gpu_milli, v.cpu_milli, v.mem_mib)


def pools(specs: list[QueueSpec]) -> dict[tuple[str, str], list[QueueSpec]]:
    found: dict[tuple[str, str], list[QueueSpec]] = {}
    for spec in specs:
        for key in spec.nominal:
            found.setdefault((spec.cohort or f"solo:{spec.name}", key), []).append(spec)
    return found


def rules_hold(specs: list[QueueSpec], usage: dict[tuple[str, str], ResourceVector]) -> bool:
    """Every quota rule, per pool and component, on the given usage."""
    for (_, key), members in pools(specs).items():
        for dim in range(3):
            pool_cap = pool_use = 0
            for spec in members:
                u = components(usage.get((spec.name, key), ResourceVector.zero()))[dim]
                n = components(spec.nominal[key])[dim]
                if spec.cohort is None:
                    if u > n:
                        return False
                    continue
                borrow = spec.borrowing_limit.get(key) if spec.borrowing_limit else None
                if borrow is not None and u > n + components(borrow)[dim]:
                    return False
                lend_v = spec.lending_limit.get(key) if spec.lending_limit else None
                lend = min(components(lend_v)[dim], n) if lend_v is not None else n
                pool_cap += lend
                pool_use += max(u - (n - lend), 0)
            if pool_use > pool_cap:
                return False
    return True


def snapshot(ledger: QuotaLedger, specs: list[QueueSpec]) -> dict[tuple[str, str], ResourceVector]:
    return {(s.name, k): ledger.usage(s.name, k) for s in specs for k in s.nominal}


def check_invariants(ledger: QuotaLedger, specs: list[QueueSpec]) -> None:
    usage = snapshot(ledger, specs)
    assert rules_hold(specs, usage)
    for (_, key), members in pools(specs).items():
        total_used = sum((usage[(s.name, key)] for s in members), ResourceVector.zero())
        total_nominal = sum((s.nominal[key] for s in members), ResourceVector.zero())
        assert total_used <= total_nominal  # a cohort never uses more than it owns
        borrowed = sum((ledger.borrowed(s.name, key) for s in members), ResourceVector.zero())
        lendable = sum((ledger.lendable(s.name, key) for s in members), ResourceVector.zero())
        assert borrowed <= lendable  # every borrowed unit is covered by a lender within its limits
        for spec in members:
            cap = spec.nominal[key] + (
                spec.borrowing_limit.get(key, ResourceVector(BIG, BIG, BIG))
                if spec.borrowing_limit
                else ResourceVector(BIG, BIG, BIG)
            )
            assert usage[(spec.name, key)] <= (cap if spec.cohort else spec.nominal[key])
            lent = ledger.reclaimable_for(spec.name, key)
            assert lent <= ledger.lendable(spec.name, key)
            if spec.lending_limit and key in spec.lending_limit:
                assert lent <= spec.lending_limit[key] and ledger.lendable(spec.name, key) <= spec.lending_limit[key]


operations = st.lists(
    st.tuples(st.booleans(), st.integers(0, 3), st.sampled_from(DEMAND_MODELS), demands, st.integers(0, 100)),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(queue_specs(), operations)
def test_quota_rules_hold_under_random_admit_and_release(
    specs: list[QueueSpec], ops: list[tuple[bool, int, str, ResourceVector, int]]
) -> None:
    ledger = QuotaLedger(specs)
    held: list[Held] = []
    for is_admit, q, model, demand, pick in ops:
        if is_admit or not held:
            spec = specs[q % len(specs)]
            before = snapshot(ledger, specs)
            admission = ledger.can_admit(spec.name, model, demand)
            key = spec.flavor_key(model)
            after = dict(before)
            if key is not None:
                after[(spec.name, key)] = before[(spec.name, key)] + demand
            # Refused exactly when admitting would break a rule (or no quota entry covers the model).
            assert (admission is not None) == (key is not None and rules_hold(specs, after))
            if admission is not None:
                assert admission.from_nominal + admission.borrowed == demand
                borrowed_before = ledger.borrowed(spec.name, model)
                ledger.admit(spec.name, model, demand, admission)
                assert ledger.borrowed(spec.name, model) - borrowed_before == admission.borrowed
                held.append(Held(spec.name, model, demand))
        else:
            item = held.pop(pick % len(held))
            ledger.release(item.queue, item.model, item.demand)
        check_invariants(ledger, specs)
    for item in held:
        ledger.release(item.queue, item.model, item.demand)
    assert all(v == ResourceVector.zero() for v in snapshot(ledger, specs).values())


@settings(max_examples=200, deadline=None)
@given(queue_specs(), operations, st.integers(0, 3), st.sampled_from(DEMAND_MODELS), demands)
def test_quota_need_frees_enough_to_admit(
    specs: list[QueueSpec],
    ops: list[tuple[bool, int, str, ResourceVector, int]],
    q: int,
    model: str,
    demand: ResourceVector,
) -> None:
    """Shedding the nominal shortfall from the own queue and the cohort deficit from borrowers admits the demand."""
    ledger = QuotaLedger(specs)
    for _, qi, m, d, _ in ops:
        spec = specs[qi % len(specs)]
        if ledger.can_admit(spec.name, m, d) is not None:
            ledger.admit(spec.name, m, d)
    spec = specs[q % len(specs)]
    need = ledger.quota_need(spec.name, model, demand)
    if need is None:
        assert ledger.can_admit(spec.name, model, demand) is None
        return
    if need.nominal_shortfall.is_zero() and need.cohort_deficit.is_zero():
        admission = ledger.can_admit(spec.name, model, demand)
        assert admission is not None and not admission.is_borrowing
    if need.borrow_excess is not None and need.borrow_excess.is_zero():
        assert ledger.can_admit(spec.name, model, demand) is not None
