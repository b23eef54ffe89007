"""MIG profile tables and the smallest-profile choice used by replica placement."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tessera.core.errors import UnknownGpuModelError
from tessera.serving.policies.mig import (
    COMPUTE_SLICES,
    GIB,
    MEMORY_SLICES,
    MIG_PROFILES,
    compute_share,
    mig_profile,
    mig_profiles,
    smallest_profile,
)

EXPECTED_NAMES = {
    "A100-40GB": ["1g.5gb", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"],
    "A100-80GB": ["1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"],
    "H100-80GB": ["1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"],
    "H200": ["1g.18gb", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"],
}


@pytest.mark.parametrize("gpu", sorted(EXPECTED_NAMES))
def test_each_gpu_has_the_documented_profiles_in_size_order(gpu: str) -> None:
    profiles = mig_profiles(gpu)
    assert [p.name for p in profiles] == EXPECTED_NAMES[gpu]
    assert [p.max_instances for p in profiles] == [7, 4, 3, 2, 1, 1]
    assert [p.compute_sevenths for p in profiles] == [1, 1, 2, 3, 4, 7]
    assert [p.memory_eighths for p in profiles] == [1, 2, 2, 4, 4, 8]


@pytest.mark.parametrize("gpu", sorted(EXPECTED_NAMES))
def test_profile_tables_are_consistent_with_the_slice_counts(gpu: str) -> None:
    profiles = mig_profiles(gpu)
    whole = profiles[-1]
    for profile in profiles:
        # The name's compute count and its nominal memory agree with the slice fields.
        compute, nominal = profile.name.split(".")
        assert int(compute.removesuffix("g")) == profile.compute_sevenths
        assert profile.memory_gib <= int(nominal.removesuffix("gb"))
        # Usable memory is about the memory slices' share of the whole GPU's (the H200's 1g.18gb lists 16 GiB of
        # an eighth of 139.75: the driver keeps more back on small slices).
        share = whole.memory_gib * profile.memory_eighths / MEMORY_SLICES
        assert profile.memory_gib == pytest.approx(share, rel=0.1)
        # A full set of the profile never exceeds the GPU's slices.
        assert profile.max_instances * profile.compute_sevenths <= COMPUTE_SLICES
        assert profile.max_instances * profile.memory_eighths <= MEMORY_SLICES


def test_names_resolve_through_the_core_catalog() -> None:
    assert mig_profiles("h100") == MIG_PROFILES["H100-80GB"]
    assert mig_profiles("a100_80gb") == MIG_PROFILES["A100-80GB"]
    assert mig_profiles("T4") == ()
    with pytest.raises(UnknownGpuModelError):
        mig_profiles("B9000")


def test_a_profile_is_found_by_name_with_or_without_the_mig_prefix() -> None:
    assert mig_profile("H100-80GB", "MIG 3g.40gb").compute_sevenths == 3
    assert mig_profile("H200", "7g.141gb").memory_eighths == 8
    with pytest.raises(ValueError, match="unknown MIG profile"):
        mig_profile("H100-80GB", "3g.20gb")


def chosen_name(gpu: str, mem_bytes: int, compute_sevenths: int = 1) -> str | None:
    profile = smallest_profile(gpu, mem_bytes, compute_sevenths)
    return None if profile is None else profile.name


def test_smallest_profile_picks_the_fewest_memory_then_compute_slices() -> None:
    assert chosen_name("H100-80GB", 9 * GIB) == "1g.10gb"
    # 12 GiB needs two memory slices: 1g.20gb, not 2g.20gb (which would idle a compute slice).
    assert chosen_name("H100-80GB", 12 * GIB) == "1g.20gb"
    assert chosen_name("H100-80GB", 12 * GIB, compute_sevenths=2) == "2g.20gb"
    # 3g.40gb and 4g.40gb hold the same memory: three slices of compute asked, three given.
    assert chosen_name("A100-80GB", 30 * GIB, compute_sevenths=3) == "3g.40gb"
    assert chosen_name("A100-80GB", 30 * GIB, compute_sevenths=4) == "4g.40gb"
    assert chosen_name("A100-40GB", 4 * GIB) == "1g.5gb"
    assert chosen_name("H200", 100 * GIB) == "7g.141gb"


def test_smallest_profile_is_none_when_nothing_fits() -> None:
    assert smallest_profile("H100-80GB", 80 * GIB) is None  # usable memory is under the nominal 80 GB
    assert smallest_profile("T4", 1 * GIB) is None  # no MIG
    with pytest.raises(ValueError):
        smallest_profile("H100-80GB", -1)
    with pytest.raises(ValueError):
        smallest_profile("H100-80GB", GIB, compute_sevenths=8)


@given(
    gpu=st.sampled_from(sorted(EXPECTED_NAMES)),
    mem_bytes=st.integers(min_value=0, max_value=150 * GIB),
    compute=st.integers(min_value=1, max_value=7),
)
def test_the_chosen_profile_fits_and_no_fitting_profile_is_smaller(gpu: str, mem_bytes: int, compute: int) -> None:
    chosen = smallest_profile(gpu, mem_bytes, compute)
    fitting = [p for p in mig_profiles(gpu) if p.memory_bytes >= mem_bytes and p.compute_sevenths >= compute]
    if chosen is None:
        assert not fitting
        return
    assert chosen.memory_bytes >= mem_bytes and chosen.compute_sevenths >= compute
    assert all(
        (chosen.memory_eighths, chosen.compute_sevenths) <= (p.memory_eighths, p.compute_sevenths) for p in fitting
    )


def test_compute_share_is_the_fraction_of_seven_slices() -> None:
    assert compute_share(mig_profile("H100-80GB", "1g.10gb")) == pytest.approx(1 / 7)
    assert compute_share(mig_profile("H100-80GB", "3g.40gb")) == pytest.approx(3 / 7)
    assert compute_share(mig_profile("H200", "7g.141gb")) == 1.0
