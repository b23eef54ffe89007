"""Performance models fitted from measurements: ``CalibratedPerf`` (the Splitwise characterization grid) and
``ProfilePerf`` (a team's own profile of its engine), with the iteration rule of ``perf_fit.IterationRule``.

Calibration from the grid, per (model, hardware, tensor_parallel):

1. Repeats of a grid point (prompt_size, batch_size, token_size) are combined by median.
2. Failed runs are dropped: a grid point whose prefill takes less than half that of a grid point with fewer batch
   tokens did not do the work it names (llama2-70b at TP2 with 64 x 512-token prompts: the KV cache cannot hold
   the batch in the memory the weights leave, and both its prefill and its decode step collapse).
3. Prefill: the median per batch-token value (prompt_size x batch_size) over the kept grid points, made
   non-decreasing by pooling adjacent violators, interpolated linearly (``PiecewiseLinear``).
4. Decode: ``fit_decode_step`` on every kept grid point, at batch_size sequences holding
   batch_size x (prompt_size + token_size / 2) tokens (the mean context over the run's decode), with the per-KV-token
   cost floored at the time the model's KV bytes take at the GPU's memory bandwidth where the shape is known.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Self

from tessera.core.errors import UnknownGpuModelError
from tessera.serving.gpus import GpuSpec, gpu_spec
from tessera.serving.models import GRID_MODELS, KNOWN_ARCHITECTURES, ModelSpec
from tessera.serving.perf_csv import SplitwiseRow, read_profile_rows, read_splitwise_rows, select_config
from tessera.serving.perf_fit import DecodeSample, DecodeStep, IterationRule, PiecewiseLinear, fit_decode_step
from tessera.serving.perf_scaling import ReplicaShape, ScalingAssumptions, scale_decode, scale_prefill

# Models of the Splitwise grid that the serving catalog does not hold (public architecture figures).
CALIBRATION_MODELS: Mapping[str, ModelSpec] = GRID_MODELS
# The grid's hardware labels; "-pcap" runs are the same GPU under a power cap.
SPLITWISE_HARDWARE: dict[str, str] = {"a100-80gb": "A100-80GB", "h100-80gb": "H100-80GB", "h100-80gb-pcap": "H100-80GB"}
FAILED_RUN_FRACTION = 0.5


def splitwise_gpu(hardware: str) -> str | None:
    """The serving GPU of a grid hardware label: the grid's own labels, else any GPU name the catalog knows (a team's
    file in the Splitwise format may say ``l4`` or ``H200``); None when unknown."""
    known = SPLITWISE_HARDWARE.get(hardware.lower())
    if known is not None:
        return known
    try:
        return gpu_spec(hardware).name
    except UnknownGpuModelError:
        return None


def calibration_shape(
    model: str, hardware: str, tensor_parallel: int, known: Mapping[str, ModelSpec] | None = None
) -> ReplicaShape | None:
    """The physics of a grid configuration, or None when its model or hardware is not known here. ``known`` adds
    architectures (a model brought by its config.json) to the catalog's and the grid's."""
    spec = (known or {}).get(model) or KNOWN_ARCHITECTURES.get(model)
    gpu = splitwise_gpu(hardware)
    if spec is None or gpu is None:
        return None
    return ReplicaShape(spec, gpu_spec(gpu), tensor_parallel)


@dataclass(frozen=True, slots=True)
class GridPoint:
    prompt_size: int
    batch_size: int
    token_size: int
    prefill_ms: float  # median over repeats
    decode_ms: float  # median over repeats
    repeats: int

    @property
    def batch_tokens(self) -> int:
        return self.prompt_size * self.batch_size

    @property
    def kv_tokens(self) -> float:
        return self.batch_size * (self.prompt_size + self.token_size / 2)


def grid_points(rows: Sequence[SplitwiseRow]) -> list[GridPoint]:
    """The medians per grid point of one configuration's rows, sorted by (batch tokens, batch, tokens)."""
    groups: dict[tuple[int, int, int], list[SplitwiseRow]] = defaultdict(list)
    for row in rows:
        groups[(row.prompt_size, row.batch_size, row.token_size)].append(row)
    points = [
        GridPoint(
            p,
            b,
            t,
            statistics.median(r.prompt_time_ms for r in g),
            statistics.median(r.token_time_ms for r in g),
            len(g),
        )
        for (p, b, t), g in groups.items()
    ]
    return sorted(points, key=lambda g: (g.batch_tokens, g.batch_size, g.token_size))


def split_failed_runs(points: Sequence[GridPoint]) -> tuple[list[GridPoint], list[GridPoint]]:
    """(kept, failed): a point fails when its prefill is under FAILED_RUN_FRACTION of a smaller batch's."""
    kept: list[GridPoint] = []
    failed: list[GridPoint] = []
    for point in points:
        smaller = [q.prefill_ms for q in points if q.batch_tokens < point.batch_tokens]
        (failed if smaller and point.prefill_ms < FAILED_RUN_FRACTION * max(smaller) else kept).append(point)
    return kept, failed


def prefill_curve(samples: Sequence[tuple[int, float]]) -> PiecewiseLinear:
    """The monotone curve through the median seconds per batch-token value of ``(tokens, seconds)`` samples, each
    value weighted by its number of samples."""
    by_tokens: dict[int, list[float]] = defaultdict(list)
    for tokens, seconds in samples:
        by_tokens[tokens].append(seconds)
    xs = sorted(by_tokens)
    return PiecewiseLinear.monotone(
        xs, [statistics.median(by_tokens[x]) for x in xs], [float(len(by_tokens[x])) for x in xs]
    )


@dataclass(frozen=True, slots=True)
class FittedPerf(IterationRule):
    """A fitted prefill curve and decode step; ``source`` is the replica they describe, when known (scaling needs
    it). Implements the engine's performance-model protocol (``iteration_s``, ``decode_affine``)."""

    prefill: PiecewiseLinear
    decode: DecodeStep
    source: ReplicaShape | None = None

    def prefill_s(self, tokens: int) -> float:
        return self.prefill(tokens)

    def decode_intercept_s(self, batch: int) -> float:
        return self.decode.intercept_at(batch)

    def kv_token_s(self) -> float:
        return self.decode.per_kv_token_s

    def scaled_to(
        self,
        spec: ModelSpec,
        gpu: str | GpuSpec,
        tensor_parallel: int,
        assumptions: ScalingAssumptions | None = None,
    ) -> Self:
        """This model moved to ``spec`` on ``tensor_parallel`` GPUs of type ``gpu`` (see ``perf_scaling``)."""
        if self.source is None:
            raise ValueError("cannot scale a performance model whose source (model, GPU, TP) is unknown")
        assume = assumptions or ScalingAssumptions()
        target = ReplicaShape(spec, gpu if isinstance(gpu, GpuSpec) else gpu_spec(gpu), tensor_parallel)
        decode = scale_decode(self.decode, self.source, target, assume)
        prefill = scale_prefill(self.prefill, self.decode.intercept_s, decode.intercept_s, self.source, target, assume)
        return replace(self, prefill=prefill, decode=decode, source=target)


@dataclass(frozen=True, slots=True)
class CalibratedPerf(FittedPerf):
    """Fitted from the Splitwise grid (see the module docstring)."""

    @classmethod
    def from_csv(
        cls, path: str | Path, model: str = "llama2-70b", hardware: str = "h100-80gb", tensor_parallel: int = 8
    ) -> CalibratedPerf:
        rows = select_config(path, read_splitwise_rows(path), model, hardware, tensor_parallel)
        return cls.from_rows(rows)

    @classmethod
    def from_rows(cls, rows: Sequence[SplitwiseRow], known: Mapping[str, ModelSpec] | None = None) -> CalibratedPerf:
        """From the rows of one configuration (all with the same model, hardware and TP); ``known`` as in
        ``calibration_shape``."""
        configs = {r.config for r in rows}
        if len(configs) != 1:
            raise ValueError(f"calibration rows must hold exactly one configuration, got {sorted(configs)}")
        source = calibration_shape(*configs.pop(), known)
        kept, _ = split_failed_runs(grid_points(rows))
        prefill = prefill_curve([(g.batch_tokens, g.prefill_ms / 1000) for g in kept])
        samples = [DecodeSample(g.batch_size, g.kv_tokens, g.decode_ms / 1000) for g in kept]
        kv_floor_s = source.kv_read_s_per_token() if source else 0.0
        return cls(prefill, fit_decode_step(samples, kv_floor_s), source)


@dataclass(frozen=True, slots=True)
class ProfilePerf(FittedPerf):
    """Fitted from a user profile (format in ``perf_csv``): a team calibrates the twin to its own engine.

    Give ``source`` (the model, GPU and TP the profile was measured on) to floor the per-KV-token cost at the
    bandwidth bound and to allow ``scaled_to``; give decode rows at three or more batch sizes and several context
    sizes, else the batch and KV terms are not told apart."""

    @classmethod
    def from_csv(cls, path: str | Path, source: ReplicaShape | None = None) -> ProfilePerf:
        rows = read_profile_rows(path)
        prefill = prefill_curve([(r.tokens, r.time_ms / 1000) for r in rows if r.kind == "prefill"])
        decode_groups: dict[tuple[int, int], list[float]] = defaultdict(list)
        for r in rows:
            if r.kind == "decode":
                decode_groups[(r.batch_size, r.kv_tokens)].append(r.time_ms / 1000)
        samples = [DecodeSample(b, kv, statistics.median(t)) for (b, kv), t in sorted(decode_groups.items())]
        kv_floor_s = source.kv_read_s_per_token() if source else 0.0
        return cls(prefill, fit_decode_step(samples, kv_floor_s), source)
