"""Which performance model the twin's engines run on.

- ``--model-profile [NAME=]PATH``: a model's own measurements (``ModelBook.perf``: its Splitwise-format rows, or a
  profile in the project's format), for that model only; it comes first.
- ``--perf-profile CSV``: the team's own measurements (``ProfilePerf``, format in docs/serving-perf.md), used as
  measured for every other model of the study (a profile describes one engine on one GPU; split a mixed fleet into
  one study per profile).
- Otherwise the calibrated model (``CalibratedPerf``, scaled to each model, GPU and tensor parallelism) when the
  measured latencies are beside the checkout (``../shared/traces/splitwise/perf_model.csv``), else the roofline
  model from GPU datasheets (``RooflinePerf``). ``describe`` says which one a study used.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tessera.serving.model_book import ModelBook
from tessera.serving.models import ModelSpec
from tessera.serving.perf_model import ProfilePerf, shared_calibration_csv
from tessera.serving.policies.engine_parts import IterationTimes

PerfFactory = Callable[[ModelSpec, str, int], IterationTimes]


def make_perf_factory(
    profile: Path | None = None, calibration: Path | None = None, book: ModelBook | None = None
) -> PerfFactory:
    """A factory of engine timings per (model, GPU model, tensor parallelism), each built once."""
    cache: dict[tuple[str, str, int], IterationTimes] = {}
    measured = ProfilePerf.from_csv(profile) if profile is not None else None
    csv = calibration if calibration is not None else shared_calibration_csv()
    models = book if book is not None else ModelBook.default()

    def factory(spec: ModelSpec, gpu: str, tensor_parallel: int) -> IterationTimes:
        own = models.entries.get(spec.name)
        if measured is not None and (own is None or own.profile is None):
            return measured
        key = (spec.name, gpu, tensor_parallel)
        if key not in cache:
            cache[key] = models.perf(spec, gpu, tensor_parallel, csv)
        return cache[key]

    return factory


def describe(profile: Path | None = None) -> str:
    if profile is not None:
        return f"the profile {profile}"
    csv = shared_calibration_csv()
    return f"calibrated on {csv}" if csv is not None else "the roofline model (no calibration file)"
