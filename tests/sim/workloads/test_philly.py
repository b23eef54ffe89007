"""Philly runtimes: the embedded lognormal fit, the empirical sampler and the runtime list loader."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tessera.core.errors import InputFileError, InvalidRequestError
from tessera.sim.workloads.philly import (
    MAX_RUNTIME_S,
    MIN_RUNTIME_S,
    RuntimeSampler,
    load_runtimes,
    philly_runtime_sampler,
)

PHILLY = Path(__file__).resolve().parents[3].parent / "shared" / "traces" / "philly" / "philly_runtime.csv"


def test_the_embedded_fit_matches_phillys_median_and_p90() -> None:
    sampler = philly_runtime_sampler(None, seed=0)
    assert sampler.source == "lognormal fit"
    runtimes = sampler.sample(200_000)
    assert float(np.median(runtimes)) == pytest.approx(1186.0, rel=0.03)
    assert float(np.percentile(runtimes, 90)) == pytest.approx(12_859.0, rel=0.05)
    assert runtimes.min() >= MIN_RUNTIME_S and runtimes.max() <= MAX_RUNTIME_S


def test_sampling_is_deterministic_and_draw_follows_the_given_generator() -> None:
    sampler = philly_runtime_sampler(None, seed=5)
    assert np.array_equal(sampler.sample(100), sampler.sample(100))
    assert not np.array_equal(sampler.sample(100), philly_runtime_sampler(None, seed=6).sample(100))
    a = sampler.draw(np.random.default_rng(1), 50)
    b = sampler.draw(np.random.default_rng(1), 50)
    assert np.array_equal(a, b)


def test_an_empirical_file_is_clipped_and_bootstrapped(tmp_path: Path) -> None:
    path = tmp_path / "runtime.csv"
    path.write_text("runtime\n0.0\n30\n500\n1000.5\n9999999\n")
    assert list(load_runtimes(path)) == [0.0, 30.0, 500.0, 1000.5, 9999999.0]
    sampler = philly_runtime_sampler(path, seed=0, min_s=60.0, max_s=5000.0)
    assert sampler.source == str(path)
    assert set(sampler.sample(2000).tolist()) == {60.0, 500.0, 1000.5, 5000.0}


@pytest.mark.parametrize(("text", "fragment"), [("runtime\nabc\n", "not a number"), ("runtime\n-5\n", ">= 0")])
def test_bad_runtimes_name_the_line(tmp_path: Path, text: str, fragment: str) -> None:
    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(InputFileError, match=fragment) as info:
        load_runtimes(path)
    assert (info.value.line, info.value.field) == (2, "runtime")


def test_a_missing_column_or_bad_parameters_are_rejected(tmp_path: Path) -> None:
    path = tmp_path / "other.csv"
    path.write_text("seconds\n5\n")
    with pytest.raises(InputFileError, match="required column missing"):
        load_runtimes(path)
    with pytest.raises(InvalidRequestError, match="min_s"):
        RuntimeSampler("x", min_s=10.0, max_s=5.0)
    with pytest.raises(InvalidRequestError, match="median_s"):
        RuntimeSampler("x", median_s=0.0)


@pytest.mark.skipif(not PHILLY.exists(), reason="../shared/traces/philly is not here")
def test_the_philly_file() -> None:
    runtimes = load_runtimes(PHILLY)
    assert len(runtimes) == 83_154
    assert float(np.median(runtimes)) == pytest.approx(1186.0)
    sample = philly_runtime_sampler(PHILLY, seed=0).sample(20_000)
    assert float(np.median(sample)) == pytest.approx(1186.0, rel=0.2)
    assert float(np.percentile(sample, 90)) == pytest.approx(12_859.0, rel=0.2)
