"""Heterogeneity and interference models: how fast a job type trains on a GPU type, alone and sharing a GPU.

Heterogeneity-aware placement, the ``gavel`` baseline and the timeline simulator (runtime = work ÷ throughput on
the chosen GPU type) call these models. Both are plain data (a measured table) plus a fitted fallback, so that they
answer for every (job type, GPU type) pair, measured or not:

- ``ThroughputModel``: isolated throughput ``{(job_type, gpu_model): steps_per_s}``. For a pair not in the table,
  the job type's throughput on the reference GPU is scaled by the GPU's relative speed (the catalog's
  ``relative_speed``; K80, which the catalog does not hold, is known here at 0.3). An unknown job type runs at
  ``default_steps_per_s`` on the reference GPU, scaled the same way.
- ``ColocationModel``: ``{(job_a, job_b, gpu_model): (factor_a, factor_b)}`` where a factor is the co-located
  throughput divided by the isolated throughput. Sharing one GPU is worth it only when ``net_gain`` =
  factor_a + factor_b − 1 > 0.

The measured tables come from Gavel (``tessera.sim.workloads.gavel`` loads them); this module does no I/O. GPU model
names are canonicalised through the catalog (``v100`` → ``V100M16``, ``p100`` → ``P100``; ``k80`` → ``K80``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from tessera.core.catalog import resolve_model
from tessera.core.errors import InvalidRequestError

# GPU models that measured tables use but the catalog (which lists models a cluster may hold) does not.
# K80: roughly 0.3 of a V100 for dense training (Gavel's table puts ResNet-50 at about 0.14, A3C at about 0.6).
EXTRA_RELATIVE_SPEEDS: dict[str, float] = {"K80": 0.3}

DEFAULT_REFERENCE_MODEL = "V100M16"
DEFAULT_STEPS_PER_S = 1.0  # an unknown job type's throughput on the reference GPU
# An unmeasured co-location when the table is empty: about the mean factor of Gavel's measured single-GPU pairs
# (0.555, OOM pairs counted as 0), so that an empty model shares a GPU like the average measured pair.
DEFAULT_COLOCATION_FACTOR = 0.55


def canonical_gpu_model(name: str) -> str:
    """The catalog's name for ``name`` (``v100`` → ``V100M16``), or ``K80``; raises ``UnknownGpuModelError``."""
    key = name.strip().upper()
    if key in EXTRA_RELATIVE_SPEEDS:
        return key
    return resolve_model(name).name


def relative_speed(gpu_model: str) -> float:
    """Dense training speed relative to a V100 (catalog ``relative_speed``, or the local K80 entry)."""
    extra = EXTRA_RELATIVE_SPEEDS.get(gpu_model.strip().upper())
    return extra if extra is not None else resolve_model(gpu_model).relative_speed


def _require_rate(what: str, value: float) -> None:
    if not (math.isfinite(value) and value > 0):
        raise InvalidRequestError(what, f"must be a finite number > 0, got {value}")


@dataclass(frozen=True)
class ThroughputModel:
    """Isolated throughput per (job type, GPU model), measured where the table says and fitted elsewhere.

    ``table`` keys may name GPU models in any spelling the catalog accepts; they are stored canonical. A job type's
    reference throughput is its measured value on ``reference_model`` when there is one, else the geometric mean of
    ``steps_per_s × relative_speed(reference) / relative_speed(model)`` over its measured models (the least-squares
    fit of ``log steps_per_s = log a_job + log relative_speed(model)``).
    """

    table: Mapping[tuple[str, str], float]  # (job_type, gpu_model) -> steps per second, isolated
    reference_model: str = DEFAULT_REFERENCE_MODEL  # the GPU type fallbacks are scaled from
    default_steps_per_s: float = DEFAULT_STEPS_PER_S  # unknown job type, on the reference GPU; > 0
    _reference_steps_per_s: dict[str, float] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        _require_rate("default_steps_per_s", self.default_steps_per_s)
        reference = canonical_gpu_model(self.reference_model)
        table: dict[tuple[str, str], float] = {}
        for (job_type, gpu_model), steps_per_s in self.table.items():
            what = f"throughput[{job_type}, {gpu_model}]"
            _require_rate(what, steps_per_s)
            key = (job_type, canonical_gpu_model(gpu_model))
            if key in table:
                raise InvalidRequestError(what, f"given twice (as {key[1]})")
            table[key] = float(steps_per_s)
        object.__setattr__(self, "table", table)
        object.__setattr__(self, "reference_model", reference)
        object.__setattr__(self, "_reference_steps_per_s", _fit_reference(table, reference))

    @property
    def job_types(self) -> tuple[str, ...]:
        """The measured job types, sorted."""
        return tuple(sorted(self._reference_steps_per_s))

    def is_measured(self, job_type: str, gpu_model: str) -> bool:
        return (job_type, canonical_gpu_model(gpu_model)) in self.table

    def reference_steps_per_s(self, job_type: str) -> float:
        """``job_type``'s throughput on the reference GPU (measured, fitted, or the default rate)."""
        return self._reference_steps_per_s.get(job_type, self.default_steps_per_s)

    def throughput(self, job_type: str, gpu_model: str) -> float:
        """Steps per second of ``job_type`` alone on ``gpu_model``: measured, else scaled by relative speed."""
        model = canonical_gpu_model(gpu_model)
        measured = self.table.get((job_type, model))
        if measured is not None:
            return measured
        scale = relative_speed(model) / relative_speed(self.reference_model)
        return self.reference_steps_per_s(job_type) * scale

    def speedup(self, job_type: str, from_model: str, to_model: str) -> float:
        """How many times faster ``job_type`` runs on ``to_model`` than on ``from_model``."""
        return self.throughput(job_type, to_model) / self.throughput(job_type, from_model)


def _fit_reference(table: Mapping[tuple[str, str], float], reference: str) -> dict[str, float]:
    logs: dict[str, list[float]] = {}
    measured_on_reference: dict[str, float] = {}
    reference_speed = relative_speed(reference)
    for (job_type, gpu_model), steps_per_s in table.items():
        if gpu_model == reference:
            measured_on_reference[job_type] = steps_per_s
        implied = steps_per_s * reference_speed / relative_speed(gpu_model)
        logs.setdefault(job_type, []).append(math.log(implied))
    fitted = {job_type: math.exp(sum(values) / len(values)) for job_type, values in logs.items()}
    fitted.update(measured_on_reference)
    return fitted


def _require_factor(what: str, value: float) -> None:
    if not (math.isfinite(value) and value >= 0):
        raise InvalidRequestError(what, f"must be a finite number >= 0, got {value}")


@dataclass(frozen=True)
class ColocationModel:
    """Slowdown of two jobs sharing one GPU, measured where the table says and fitted elsewhere.

    A pair is looked up in either order. For an unmeasured pair the factors come from, in order: the same pair
    measured on other GPU models (mean per side); each job's mean own factor over all its measured co-locations;
    the mean factor over the whole table; ``default_factor`` when the table is empty.
    """

    table: Mapping[tuple[str, str, str], tuple[float, float]]  # (job_a, job_b, gpu_model) -> (factor_a, factor_b)
    default_factor: float = DEFAULT_COLOCATION_FACTOR  # used only when the table is empty; >= 0
    _pair_mean: dict[tuple[str, str], tuple[float, float]] = field(init=False, repr=False, compare=False)
    _job_mean: dict[str, float] = field(init=False, repr=False, compare=False)
    _table_mean: float = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        _require_factor("default_factor", self.default_factor)
        table: dict[tuple[str, str, str], tuple[float, float]] = {}
        for (job_a, job_b, gpu_model), (factor_a, factor_b) in self.table.items():
            what = f"colocation[{job_a}, {job_b}, {gpu_model}]"
            _require_factor(f"{what}.factor_a", factor_a)
            _require_factor(f"{what}.factor_b", factor_b)
            key = (job_a, job_b, canonical_gpu_model(gpu_model))
            if key in table:
                raise InvalidRequestError(what, f"given twice (as {key[2]})")
            table[key] = (float(factor_a), float(factor_b))
        object.__setattr__(self, "table", table)
        pair_factors: dict[tuple[str, str], list[tuple[float, float]]] = {}
        job_factors: dict[str, list[float]] = {}
        for (job_a, job_b, _), (factor_a, factor_b) in table.items():
            pair_factors.setdefault((job_a, job_b), []).append((factor_a, factor_b))
            job_factors.setdefault(job_a, []).append(factor_a)
            job_factors.setdefault(job_b, []).append(factor_b)
        pair_mean = {pair: (_mean([f[0] for f in fs]), _mean([f[1] for f in fs])) for pair, fs in pair_factors.items()}
        all_factors = [f for fs in job_factors.values() for f in fs]
        object.__setattr__(self, "_pair_mean", pair_mean)
        object.__setattr__(self, "_job_mean", {job: _mean(fs) for job, fs in job_factors.items()})
        object.__setattr__(self, "_table_mean", _mean(all_factors) if all_factors else self.default_factor)

    def is_measured(self, job_a: str, job_b: str, gpu_model: str) -> bool:
        model = canonical_gpu_model(gpu_model)
        return (job_a, job_b, model) in self.table or (job_b, job_a, model) in self.table

    def factors(self, job_a: str, job_b: str, gpu_model: str) -> tuple[float, float]:
        """(co-located ÷ isolated throughput of ``job_a``, the same of ``job_b``) when they share ``gpu_model``."""
        model = canonical_gpu_model(gpu_model)
        found = self.table.get((job_a, job_b, model))
        if found is not None:
            return found
        swapped = self.table.get((job_b, job_a, model))
        if swapped is not None:
            return swapped[1], swapped[0]
        pair = self._pair_mean.get((job_a, job_b))
        if pair is not None:
            return pair
        swapped_pair = self._pair_mean.get((job_b, job_a))
        if swapped_pair is not None:
            return swapped_pair[1], swapped_pair[0]
        return self._job_mean.get(job_a, self._table_mean), self._job_mean.get(job_b, self._table_mean)

    def net_gain(self, job_a: str, job_b: str, gpu_model: str) -> float:
        """factor_a + factor_b − 1: the GPU-time saved by sharing; sharing is worth it only when > 0."""
        factor_a, factor_b = self.factors(job_a, job_b, gpu_model)
        return factor_a + factor_b - 1.0

    def worth_sharing(self, job_a: str, job_b: str, gpu_model: str) -> bool:
        return self.net_gain(job_a, job_b, gpu_model) > 0.0


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)
