"""The throughput (heterogeneity) and co-location (interference) models on small hand-made tables."""

from __future__ import annotations

import math

import pytest

from tessera.core.catalog import resolve_model
from tessera.core.errors import InvalidRequestError, UnknownGpuModelError
from tessera.core.throughput import (
    DEFAULT_COLOCATION_FACTOR,
    ColocationModel,
    ThroughputModel,
    canonical_gpu_model,
    relative_speed,
)

TABLE = {
    ("resnet", "v100"): 10.0,
    ("resnet", "p100"): 4.0,
    ("resnet", "k80"): 1.0,
    ("a3c", "P100"): 3.0,  # not measured on the reference GPU
    ("a3c", "K80"): 2.0,
}


def test_gpu_names_are_canonicalised_and_k80_is_known_locally() -> None:
    assert canonical_gpu_model("v100") == "V100M16"
    assert canonical_gpu_model("p100") == "P100"
    assert canonical_gpu_model(" k80 ") == "K80"
    assert relative_speed("k80") == pytest.approx(0.3)
    assert relative_speed("T4") == resolve_model("T4").relative_speed
    with pytest.raises(UnknownGpuModelError):
        canonical_gpu_model("voodoo2")


def test_measured_pairs_are_returned_as_measured() -> None:
    model = ThroughputModel(TABLE)
    assert model.throughput("resnet", "V100M16") == 10.0
    assert model.throughput("resnet", "k80") == 1.0
    assert model.is_measured("a3c", "p100")
    assert not model.is_measured("a3c", "T4")
    assert model.job_types == ("a3c", "resnet")


def test_unmeasured_gpu_scales_the_reference_throughput_by_relative_speed() -> None:
    model = ThroughputModel(TABLE)
    t4 = resolve_model("T4").relative_speed
    h100 = resolve_model("H100").relative_speed
    assert model.throughput("resnet", "T4") == pytest.approx(10.0 * t4 / 1.0)
    assert model.throughput("resnet", "H100-80GB") == pytest.approx(10.0 * h100)
    assert model.speedup("resnet", "T4", "H100") == pytest.approx(h100 / t4)


def test_a_job_type_without_a_reference_measurement_is_fitted_geometrically() -> None:
    model = ThroughputModel(TABLE)
    implied_p100 = 3.0 * 1.0 / resolve_model("P100").relative_speed
    implied_k80 = 2.0 * 1.0 / 0.3
    expected = math.sqrt(implied_p100 * implied_k80)
    assert model.reference_steps_per_s("a3c") == pytest.approx(expected)
    assert model.throughput("a3c", "V100M32") == pytest.approx(expected * resolve_model("V100M32").relative_speed)


def test_unknown_job_type_runs_at_the_default_rate_scaled_by_speed() -> None:
    model = ThroughputModel(TABLE, default_steps_per_s=2.0)
    assert model.throughput("mystery", "V100") == pytest.approx(2.0)
    assert model.throughput("mystery", "A100-80GB") == pytest.approx(2.0 * resolve_model("A100-80GB").relative_speed)


def test_reference_model_changes_the_scaling_base() -> None:
    model = ThroughputModel({("x", "P100"): 5.0}, reference_model="p100")
    assert model.reference_model == "P100"
    assert model.throughput("x", "V100") == pytest.approx(5.0 / resolve_model("P100").relative_speed)


@pytest.mark.parametrize("bad", [0.0, -1.0, math.inf, math.nan])
def test_bad_throughputs_are_rejected(bad: float) -> None:
    with pytest.raises(InvalidRequestError, match="throughput"):
        ThroughputModel({("x", "V100"): bad})
    with pytest.raises(InvalidRequestError, match="default_steps_per_s"):
        ThroughputModel({}, default_steps_per_s=bad)


def test_two_spellings_of_one_model_are_a_duplicate() -> None:
    with pytest.raises(InvalidRequestError, match="twice"):
        ThroughputModel({("x", "V100"): 1.0, ("x", "V100M16"): 2.0})


COLOCATION = {
    ("resnet", "a3c", "v100"): (0.8, 0.9),
    ("resnet", "resnet", "v100"): (0.45, 0.45),
    ("resnet", "lm", "p100"): (0.6, 0.5),
    ("resnet", "lm", "k80"): (0.8, 0.7),
}


def test_measured_pairs_in_either_order() -> None:
    model = ColocationModel(COLOCATION)
    assert model.factors("resnet", "a3c", "V100M16") == (0.8, 0.9)
    assert model.factors("a3c", "resnet", "v100") == (0.9, 0.8)
    assert model.is_measured("a3c", "resnet", "v100")
    assert model.net_gain("resnet", "a3c", "v100") == pytest.approx(0.7)
    assert model.worth_sharing("resnet", "a3c", "v100")
    assert model.net_gain("resnet", "resnet", "v100") == pytest.approx(-0.1)
    assert not model.worth_sharing("resnet", "resnet", "v100")


def test_a_pair_measured_on_other_gpus_takes_their_mean() -> None:
    model = ColocationModel(COLOCATION)
    assert model.factors("resnet", "lm", "V100") == pytest.approx((0.7, 0.6))
    assert model.factors("lm", "resnet", "T4") == pytest.approx((0.6, 0.7))


def test_an_unmeasured_pair_uses_each_jobs_mean_factor() -> None:
    model = ColocationModel(COLOCATION)
    a3c_mean = 0.9
    lm_mean = (0.5 + 0.7) / 2
    assert model.factors("a3c", "lm", "v100") == pytest.approx((a3c_mean, lm_mean))


def test_an_unknown_job_uses_the_table_mean_and_an_empty_table_the_default() -> None:
    model = ColocationModel(COLOCATION)
    factors = [f for pair in COLOCATION.values() for f in pair]
    table_mean = sum(factors) / len(factors)
    assert model.factors("new", "newer", "T4") == pytest.approx((table_mean, table_mean))
    empty = ColocationModel({})
    assert empty.factors("x", "y", "v100") == (DEFAULT_COLOCATION_FACTOR, DEFAULT_COLOCATION_FACTOR)
    assert ColocationModel({}, default_factor=0.4).net_gain("x", "y", "v100") == pytest.approx(-0.2)


def test_bad_factors_are_rejected() -> None:
    with pytest.raises(InvalidRequestError, match="factor_b"):
        ColocationModel({("a", "b", "v100"): (0.5, -0.1)})
    with pytest.raises(InvalidRequestError, match="default_factor"):
        ColocationModel({}, default_factor=math.nan)
    with pytest.raises(UnknownGpuModelError):
        ColocationModel({("a", "b", "nope"): (0.5, 0.5)})
