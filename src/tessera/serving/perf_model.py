"""Engine timing: the performance models the engine model and the serving twin use, and how to pick one.

Every model answers two questions (the engine's ``PerfModel`` protocol, restated here as ``PerfModel``):
``iteration_s(prefill_tokens, decode_batch, kv_tokens)`` and ``decode_affine(decode_batch)``.

- ``CalibratedPerf`` (``perf_calibrated``): fitted on the Splitwise characterization grid
  (``../shared/traces/splitwise/perf_model.csv``); ``scaled_to`` moves it to another model, GPU or TP
  (``perf_scaling``). ``calibrated_perf_for`` picks the nearest measured configuration and scales it.
- ``ProfilePerf`` (``perf_calibrated``): fitted on a team's own profile of its engine (format in ``perf_csv``).
- ``RooflinePerf`` (``perf_roofline``): datasheet figures only; the default when the calibration file is absent.
- ``SplitwiseCompatPerf`` (``perf_compat``): the Splitwise simulator's own rules, for the fidelity benchmark.

``default_perf`` is what the twin calls. See docs/serving.md for the design and the fit errors.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Protocol

from tessera.serving.gpus import GpuSpec, gpu_spec
from tessera.serving.models import ModelSpec
from tessera.serving.perf_calibrated import (
    CalibratedPerf,
    FittedPerf,
    ProfilePerf,
    calibration_shape,
    splitwise_gpu,
)
from tessera.serving.perf_compat import SplitwiseCompatPerf
from tessera.serving.perf_csv import SplitwiseRow, read_splitwise_rows, select_config
from tessera.serving.perf_roofline import RooflineFactors, RooflinePerf
from tessera.serving.perf_scaling import Collectives, ReplicaShape, ScalingAssumptions, estimate_collectives

__all__ = [
    "CalibratedPerf",
    "Collectives",
    "FittedPerf",
    "PerfModel",
    "ProfilePerf",
    "ReplicaShape",
    "RooflineFactors",
    "RooflinePerf",
    "ScalingAssumptions",
    "SplitwiseCompatPerf",
    "calibrated_perf_for",
    "choose_calibration_source",
    "default_perf",
    "shared_calibration_csv",
    "sweep_collectives",
]

log = logging.getLogger(__name__)

SHARED_CALIBRATION = Path("shared") / "traces" / "splitwise" / "perf_model.csv"
PREFERRED_SOURCE_MODEL = "llama2-70b"
# Which measured hardware stands in for each serving GPU: the same GPU, else the nearest generation.
SOURCE_HARDWARE: dict[str, tuple[str, ...]] = {
    "H100-80GB": ("h100-80gb",),
    "H200": ("h100-80gb",),
    "A100-80GB": ("a100-80gb",),
    "A100-40GB": ("a100-80gb",),
    "L4": ("a100-80gb",),
    "T4": ("a100-80gb",),
}


class PerfModel(Protocol):
    def iteration_s(self, prefill_tokens: int, decode_batch: int, kv_tokens: int) -> float: ...

    def decode_affine(self, decode_batch: int) -> tuple[float, float]: ...


def shared_calibration_csv(repo_root: Path | None = None) -> Path | None:
    """``<repo root>/../shared/traces/splitwise/perf_model.csv`` when it exists (the repository root is the one
    this source tree sits in, unless given)."""
    root = repo_root if repo_root is not None else Path(__file__).resolve().parents[3]
    path = root.parent / SHARED_CALIBRATION
    return path if path.is_file() else None


@functools.lru_cache(maxsize=8)
def _rows(path: str, mtime_ns: int) -> tuple[SplitwiseRow, ...]:
    del mtime_ns  # part of the cache key only: an edited file is read again
    return tuple(read_splitwise_rows(path))


def _cached_rows(path: str | Path) -> list[SplitwiseRow]:
    resolved = Path(path)
    try:
        mtime_ns = resolved.stat().st_mtime_ns
    except OSError:
        mtime_ns = -1  # let the reader raise its InputFileError
    return list(_rows(str(resolved), mtime_ns))


def choose_calibration_source(
    configs: set[tuple[str, str, int]],
    spec: ModelSpec,
    gpu: GpuSpec,
    tensor_parallel: int,
    known: Mapping[str, ModelSpec] | None = None,
) -> tuple[str, str, int]:
    """The measured (model, hardware, TP) to scale from: hardware standing in for ``gpu`` (else any), the target
    model if measured (else llama2-70b, else any model whose shape is known), then the nearest TP (log scale, the
    larger on a tie). ``known``: architectures beyond the catalog's and the grid's (``calibration_shape``)."""
    usable = {c for c in configs if calibration_shape(*c, known) is not None}
    if not usable:
        raise ValueError("no configuration of the calibration file has a known model and hardware")
    wanted = SOURCE_HARDWARE.get(gpu.name, ())
    on_hardware = {c for c in usable if c[1].lower() in wanted} or {
        c for c in usable if splitwise_gpu(c[1]) == gpu.name
    }
    pool = on_hardware or usable
    for model in (spec.name, PREFERRED_SOURCE_MODEL):
        if any(c[0] == model for c in pool):
            pool = {c for c in pool if c[0] == model}
            break
    return min(sorted(pool), key=lambda c: (abs(math.log2(c[2] / tensor_parallel)), -c[2], c[0], c[1]))


def sweep_collectives(
    path: str | Path,
    rows: Sequence[SplitwiseRow],
    model: str,
    hardware: str,
    known: Mapping[str, ModelSpec] | None = None,
) -> Collectives:
    """The collective costs estimated from every TP the rows hold for ``model`` on ``hardware``."""
    sweep = sorted({r.tensor_parallel for r in rows if r.model == model and r.hardware == hardware})
    fits = [CalibratedPerf.from_rows(select_config(path, list(rows), model, hardware, tp), known) for tp in sweep]
    return estimate_collectives([(f.source, f.decode, f.prefill) for f in fits if f.source is not None])


def calibrated_perf_for(
    path: str | Path,
    spec: ModelSpec,
    gpu: str | GpuSpec,
    tensor_parallel: int,
    assumptions: ScalingAssumptions | None = None,
    own_rows_only: bool = False,
) -> CalibratedPerf:
    """The calibrated model of ``spec`` on ``tensor_parallel`` GPUs of type ``gpu``: the measured configuration
    itself when the file has it, else the nearest one scaled (``choose_calibration_source``). ``own_rows_only``:
    calibrate from ``spec``'s own rows (a model brought by its measured profile), an ``InputFileError`` naming the
    model when the file has none."""
    target_gpu = gpu if isinstance(gpu, GpuSpec) else gpu_spec(gpu)
    rows = _cached_rows(path)
    known = {spec.name: spec}
    configs = {r.config for r in rows if r.model == spec.name or not own_rows_only}
    if not configs:
        select_config(path, rows, spec.name, "any", tensor_parallel)  # raises, listing what the file has
    model, hardware, tp = choose_calibration_source(configs, spec, target_gpu, tensor_parallel, known)
    base = CalibratedPerf.from_rows(select_config(path, rows, model, hardware, tp), known)
    target = ReplicaShape(spec, target_gpu, tensor_parallel)
    if base.source == target and assumptions is None:
        return base
    if assumptions is None:
        assumptions = ScalingAssumptions(collectives=sweep_collectives(path, rows, model, hardware, known))
    return base.scaled_to(spec, target_gpu, tensor_parallel, assumptions)


def default_perf(
    spec: ModelSpec, gpu: str | GpuSpec, tensor_parallel: int, calibration_csv: str | Path | None = None
) -> PerfModel:
    """The model the twin uses: calibrated (and scaled) when ``calibration_csv`` exists, else the roofline."""
    target_gpu = gpu if isinstance(gpu, GpuSpec) else gpu_spec(gpu)
    if calibration_csv is not None and Path(calibration_csv).is_file():
        return calibrated_perf_for(calibration_csv, spec, target_gpu, tensor_parallel)
    log.info("no calibration file (%s): roofline performance model for %s", calibration_csv, spec.name)
    return RooflinePerf(spec, target_gpu, tensor_parallel)
