"""Queue specs and the quota ledger: validation, flavors, borrowing, lending limits and reclaim."""

import pytest

from tessera.core.errors import InvalidRequestError
from tessera.core.queueing import ANY_FLAVOR, Admission, QueueSpec, QuotaLedger, ResourceVector


def gpus(n: float) -> ResourceVector:
    return ResourceVector(gpu_milli=int(n * 1000))


def star(n: float) -> dict[str, ResourceVector]:
    return {ANY_FLAVOR: gpus(n)}


# ------------------------------------------------------------------------------------------------- ResourceVector


def test_resource_vector_arithmetic_and_partial_order() -> None:
    a, b = ResourceVector(1000, 2000, 64), ResourceVector(500, 3000, 64)
    assert a + b == ResourceVector(1500, 5000, 128)
    assert a - b == ResourceVector(500, -1000, 0)
    assert (a - b).positive_part() == ResourceVector(500, 0, 0)
    assert a.minimum(b) == ResourceVector(500, 2000, 64)
    assert not a <= b and not b <= a  # a partial order
    assert ResourceVector.zero() <= a and a >= ResourceVector.zero()
    assert a.dominant_share(ResourceVector(4000, 4000, 0)) == 0.5  # memory capacity 0 is ignored


# ------------------------------------------------------------------------------------------------------ QueueSpec


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"nominal": {"*": ResourceVector(gpu_milli=-1)}}, "nominal_quota"),
        ({"cohort": "c", "nominal": star(1), "borrowing_limit": {"*": ResourceVector(0, -5)}}, "borrowing_limit"),
        ({"cohort": "c", "nominal": star(1), "lending_limit": {"*": ResourceVector(mem_mib=-5)}}, "lending_limit"),
        ({"nominal": star(1), "borrowing_limit": star(1)}, "cohort"),
        ({"nominal": star(1), "lending_limit": star(1)}, "cohort"),
        ({"cohort": "c", "nominal": star(1), "borrowing_limit": {"T4": gpus(1)}}, "borrowing_limit"),
        ({"nominal": {"NoSuchGPU": gpus(1)}}, "nominal_quota"),
        ({"nominal": star(1), "weight": 0.0}, "weight"),
        ({"nominal": star(1), "weight": float("nan")}, "weight"),
        ({"nominal": star(1), "strategy": "LIFO"}, "strategy"),
    ],
)
def test_queue_spec_rejects_bad_input_naming_the_field(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidRequestError) as err:
        QueueSpec("q", **kwargs)  # type: ignore[arg-type]
    assert err.value.field == field


def test_queue_spec_canonicalises_flavors() -> None:
    spec = QueueSpec("q", nominal={"h100": gpus(2), "*": gpus(1)})
    assert set(spec.nominal) == {"H100-80GB", "*"}
    assert spec.flavor_key("H100-80GB") == "H100-80GB"
    assert spec.flavor_key("T4") == "*"
    assert QueueSpec("r", nominal={"T4": gpus(1)}).flavor_key("A10") is None


def test_ledger_rejects_duplicate_and_unknown_queues() -> None:
    with pytest.raises(InvalidRequestError, match="twice"):
        QuotaLedger([QueueSpec("a"), QueueSpec("a")])
    with pytest.raises(InvalidRequestError) as err:
        QuotaLedger([QueueSpec("a")]).usage("b", "*")
    assert err.value.field == "queue"


# ---------------------------------------------------------------------------------------------------- the ledger


def test_queue_without_cohort_never_exceeds_nominal() -> None:
    ledger = QuotaLedger([QueueSpec("solo", nominal=star(2))])
    assert ledger.admit("solo", "T4", gpus(2)) == Admission("solo", "*", gpus(2), ResourceVector.zero())
    assert ledger.can_admit("solo", "T4", gpus(0.1)) is None
    assert ledger.quota_need("solo", "T4", gpus(1)) is not None
    assert ledger.quota_need("solo", "T4", gpus(1)).borrow_excess is None  # type: ignore[union-attr]


def test_specific_flavor_is_charged_before_star() -> None:
    ledger = QuotaLedger([QueueSpec("q", nominal={"A100-80GB": gpus(1), "*": gpus(4)})])
    ledger.admit("q", "A100-80GB", gpus(1))
    assert ledger.can_admit("q", "A100-80GB", gpus(1)) is None  # the A100 entry is full; "*" does not cover A100
    assert ledger.usage("q", "T4") == ResourceVector.zero()
    ledger.admit("q", "T4", gpus(3))
    assert ledger.usage("q", "V100M16") == gpus(3)  # both charged to "*"
    assert ledger.can_admit("q", "L4", gpus(1)) is not None


def test_unknown_flavor_in_demand_has_no_quota() -> None:
    ledger = QuotaLedger([QueueSpec("q", nominal={"T4": gpus(1)})])
    assert ledger.can_admit("q", "A10", gpus(1)) is None
    assert ledger.quota_need("q", "A10", gpus(1)) is None


def test_borrowing_from_idle_cohort_member() -> None:
    ledger = QuotaLedger([QueueSpec("a", "lab", star(4)), QueueSpec("b", "lab", star(4))])
    admission = ledger.admit("a", "T4", gpus(6))
    assert admission.from_nominal == gpus(4) and admission.borrowed == gpus(2) and admission.is_borrowing
    assert ledger.borrowed("a", "T4") == gpus(2)
    assert ledger.lendable("b", "T4") == gpus(4)
    assert ledger.reclaimable_for("b", "T4") == gpus(2)
    assert ledger.usage_cap("a", "T4") == gpus(8)
    assert ledger.can_admit("a", "T4", gpus(3)) is None  # only 2 GPUs left in the cohort


def test_lent_capacity_is_not_lent_twice() -> None:
    queues = [QueueSpec(name, "lab", star(4)) for name in ("a", "b", "c")]
    ledger = QuotaLedger(queues)
    ledger.admit("a", "*", gpus(4))
    ledger.admit("b", "*", gpus(8))  # borrows all of c's 4
    assert ledger.can_admit("a", "*", gpus(1)) is None
    assert ledger.can_admit("c", "*", gpus(1)) is None  # within nominal, but lent out: needs a reclaim
    need = ledger.quota_need("c", "*", gpus(1))
    assert need is not None
    assert need.nominal_shortfall == ResourceVector.zero() and need.cohort_deficit == gpus(1)
    ledger.release("b", "*", gpus(1))
    assert ledger.can_admit("c", "*", gpus(1)) is not None


def test_borrowing_limit() -> None:
    ledger = QuotaLedger(
        [
            QueueSpec("a", "lab", star(2), borrowing_limit=star(1)),
            QueueSpec("b", "lab", star(8)),
        ]
    )
    assert ledger.can_admit("a", "*", gpus(3)) is not None
    assert ledger.can_admit("a", "*", gpus(3.5)) is None
    need = ledger.quota_need("a", "*", gpus(4))
    assert need is not None and need.borrow_excess == gpus(1)


def test_lending_limit_keeps_part_of_the_quota_home() -> None:
    ledger = QuotaLedger([QueueSpec("a", "lab", star(2)), QueueSpec("b", "lab", star(8), lending_limit=star(3))])
    assert ledger.lendable("b", "*") == gpus(3)
    assert ledger.can_admit("a", "*", gpus(5)) is not None
    assert ledger.can_admit("a", "*", gpus(5.5)) is None
    ledger.admit("b", "*", gpus(6))  # 2 unused: lends at most 2 now
    assert ledger.lendable("b", "*") == gpus(2)
    assert ledger.can_admit("a", "*", gpus(4)) is not None and ledger.can_admit("a", "*", gpus(4.5)) is None


def test_cohorts_and_flavor_pools_are_separate() -> None:
    ledger = QuotaLedger(
        [
            QueueSpec("a", "one", {"T4": gpus(1), "*": gpus(1)}),
            QueueSpec("b", "one", {"A100-80GB": gpus(4)}),
            QueueSpec("c", "two", star(8)),
        ]
    )
    assert ledger.can_admit("a", "T4", gpus(2)) is None  # nobody else in "one" has a T4 entry
    assert ledger.can_admit("a", "L4", gpus(2)) is None  # c's "*" is in another cohort
    assert ledger.can_admit("a", "L4", gpus(1)) is not None


def test_cpu_and_memory_count_too() -> None:
    ledger = QuotaLedger([QueueSpec("a", nominal={"*": ResourceVector(1000, 8000, 1024)})])
    assert ledger.can_admit("a", "*", ResourceVector(500, 8000, 1024)) is not None
    assert ledger.can_admit("a", "*", ResourceVector(500, 8001, 0)) is None


def test_admit_and_release_refuse_what_does_not_fit() -> None:
    ledger = QuotaLedger([QueueSpec("a", "lab", star(2)), QueueSpec("b", "lab", star(2))])
    stale = ledger.can_admit("a", "*", gpus(3))
    assert stale is not None
    ledger.admit("b", "*", gpus(2))
    with pytest.raises(InvalidRequestError, match="does not fit"):
        ledger.admit("a", "*", gpus(3), stale)
    with pytest.raises(InvalidRequestError) as err:
        ledger.release("b", "*", gpus(3))
    assert err.value.field == "demand"
    with pytest.raises(InvalidRequestError):
        ledger.can_admit("a", "*", ResourceVector(gpu_milli=-1))


def test_copy_is_independent() -> None:
    ledger = QuotaLedger([QueueSpec("a", nominal=star(2))])
    ledger.admit("a", "*", gpus(1))
    trial = ledger.copy()
    trial.release("a", "*", gpus(1))
    assert ledger.usage("a", "*") == gpus(1) and trial.usage("a", "*") == ResourceVector.zero()
