"""The twin against the Splitwise simulator's results on the same inputs (``bench/serving_fidelity.py``).

A results file (``../shared/traces/splitwise-results/``) holds, per cluster size, the latency percentiles that the
Splitwise simulator reported for one model replayed from one request trace. A row may name any model of the twin's
``ModelBook``: the catalog's, bloom-176b of the Splitwise grid, or one brought by its config.json and measured rows
(``tessera.serving.model_book``); its timing comes from its own rows of the perf-model file (or of its own
Splitwise-format profile). ``compare`` replays that trace on the twin, one run per row, set up to model what that
simulator models (docs/serving-fidelity.md says why each choice):

- one replica per server on its whole GPUs (``servers`` replicas, fixed, loaded before the trace starts), no
  autoscaling, no admission shedding, every request of one class with targets nothing can miss;
- the ``token-jsq`` router (join the shortest queue counted in prompt tokens to prefill plus unfinished requests);
- the engine as that simulator's baseline instance runs: prompts never chunked, the iteration's 2,048-token budget
  given to prompts first (the first one whole, whatever its size) and decoding sequences filling what is left (the
  rest skip the iteration), at most 512 sequences, first come first served, no watermark;
- its KV-cache accounting: the GPUs' memory minus the weights, over ``2 x layers x hidden x dtype`` bytes per token
  (that simulator's formula, which counts every attention head: no grouped-query attention);
- timing: ``compat`` mode uses that simulator's own interpolation rules (``SplitwiseCompatPerf``), ``calibrated``
  mode the twin's batch-aware model (``calibrated_perf_for``), everything else equal.

Metrics as that simulator defines them, per request, percentiles over all requests: TTFT = first token - arrival;
TBT = (end - first token) / output tokens (a per-request mean, divided by all the output tokens); E2E = end -
arrival; queueing = the start of the request's prefill iteration - arrival.
"""

from __future__ import annotations

import csv
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import numpy.typing as npt

from tessera.core.catalog import resolve_model
from tessera.core.cluster import NodeSpec
from tessera.core.errors import InputFileError, InvalidRequestError
from tessera.serving.model_book import ModelBook
from tessera.serving.models import MIB, ModelSpec
from tessera.serving.perf_calibrated import splitwise_gpu
from tessera.serving.perf_model import SplitwiseCompatPerf, calibrated_perf_for
from tessera.serving.policies.engine import Engine
from tessera.serving.policies.engine_parts import Completion, EngineConfig, IterationTimes
from tessera.serving.policies.requests import InferenceRequest, SloClass, SloTarget
from tessera.serving.setups import PolicySetup, ReplicaSizing
from tessera.sim.serving.fleet import Replica
from tessera.sim.serving.outcomes import Outcomes
from tessera.sim.serving.runtime import ModelRuntime
from tessera.sim.serving.trace import TraceArrays
from tessera.sim.serving.twin import Twin, TwinInputs

FloatArray = npt.NDArray[np.float64]

MODES: tuple[str, ...] = ("compat", "calibrated")
METRICS: tuple[str, ...] = ("ttft", "tbt", "e2e", "queue")
PERCENTILES: tuple[int, ...] = (50, 90, 99)
SCORED_METRICS: tuple[str, ...] = ("ttft", "tbt", "e2e")  # the goal is over these (queueing is shown only)
SATURATED_TTFT_P99_S = 10.0  # a row whose reference TTFT p99 reaches this is a saturated cluster: not scored
MAX_BATCH_SIZE = 512  # the Splitwise baseline instance's max_batch_size
MAX_BATCH_TOKENS = 2048  # ... and its max_batch_tokens
NEVER_MISSED = SloTarget(ttft_s=1e12, tpot_s=1e12)
RESULT_COLUMNS = ("model", "hardware", "scheduler", "servers", "gpus", "tensor_parallel", "requests")


def column(metric: str, pct: int) -> str:
    """The results file's column for ``metric`` at percentile ``pct``, e.g. ``ttft_s_p99``."""
    return f"{metric}_s_p{pct}"


@dataclass(frozen=True, slots=True)
class ReferenceRow:
    """One row of a results file: a cluster size and the percentiles the Splitwise simulator reported for it."""

    line: int
    model: str
    hardware: str
    servers: int
    gpus: int
    tensor_parallel: int
    scheduler: str
    requests: int
    values: dict[str, float]  # column(metric, pct) -> seconds
    path: str = "results"  # the file it was read from, for errors

    @property
    def saturated(self) -> bool:
        return self.values[column("ttft", 99)] >= SATURATED_TTFT_P99_S


def read_results(path: str | Path) -> list[ReferenceRow]:
    """The rows of a Splitwise results file; raises ``InputFileError`` naming the line and the column."""
    name = str(path)
    wanted = RESULT_COLUMNS + tuple(column(m, p) for m in METRICS for p in PERCENTILES)
    with open(path, newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        missing = [c for c in wanted if c not in (reader.fieldnames or [])]
        if missing:
            raise InputFileError(name, 1, missing[0], "missing column (expected " + ",".join(wanted) + ")")
        rows = []
        for record in reader:
            line = reader.line_num
            if None in record or any(record[c] is None for c in wanted):
                raise InputFileError(name, line, None, "wrong number of fields")
            ints = {c: _count(name, line, c, record[c]) for c in RESULT_COLUMNS[3:]}
            values = {c: _number(name, line, c, record[c]) for c in wanted[len(RESULT_COLUMNS) :]}
            if ints["servers"] < 1 or ints["gpus"] % ints["servers"] or ints["tensor_parallel"] < 1:
                raise InputFileError(name, line, "gpus", "must be a positive multiple of servers")
            rows.append(
                ReferenceRow(
                    line,
                    record["model"].strip(),
                    record["hardware"].strip(),
                    ints["servers"],
                    ints["gpus"],
                    ints["tensor_parallel"],
                    record["scheduler"].strip(),
                    ints["requests"],
                    values,
                    name,
                )
            )
    if not rows:
        raise InputFileError(name, 1, None, "no rows: the file has a header but no data")
    return rows


def _number(path: str, line: int, name: str, cell: str) -> float:
    try:
        value = float(cell.strip())
    except ValueError:
        raise InputFileError(path, line, name, f"{cell.strip()!r} is not a number") from None
    if not math.isfinite(value) or value < 0:
        raise InputFileError(path, line, name, f"must be a finite number >= 0, got {cell.strip()}")
    return value


def _count(path: str, line: int, name: str, cell: str) -> int:
    value = _number(path, line, name, cell)
    if not value.is_integer():
        raise InputFileError(path, line, name, f"must be a whole number, got {cell.strip()}")
    return int(value)


# ------------------------------------------------------------------------------------------------- the set-up
def row_spec(row: ReferenceRow, book: ModelBook | None = None) -> tuple[ModelSpec, str]:
    """The model (at the row's tensor parallelism) and the catalog GPU model a row describes. The model is any of
    ``book`` (by default the catalog's and the Splitwise grid's, bloom-176b included)."""
    models = book if book is not None else ModelBook.default()
    try:
        spec = replace(models.spec(row.model), tensor_parallel=row.tensor_parallel)
    except InvalidRequestError as exc:
        raise InputFileError(row.path, row.line, "model", exc.message) from None
    gpu = splitwise_gpu(row.hardware)
    if gpu is None:
        raise InputFileError(row.path, row.line, "hardware", f"unknown hardware {row.hardware!r}")
    return spec, gpu


def splitwise_kv_tokens(spec: ModelSpec, gpu: str, gpus: int) -> int:
    """KV-cache tokens of one replica as the Splitwise simulator counts them: the GPUs' memory minus the weights,
    over ``2 x layers x hidden x dtype`` bytes per token."""
    free = gpus * resolve_model(gpu).mem_mib * MIB - spec.weights_bytes
    per_token = 2 * spec.layers * spec.hidden * spec.dtype_bytes
    if free < per_token:
        raise ValueError(f"{spec.name} leaves no KV cache on {gpus} x {gpu}")
    return int(free // per_token)


def engine_config(kv_tokens: int, block_tokens: int = 16) -> EngineConfig:
    return EngineConfig(
        kv_blocks=max(1, kv_tokens // block_tokens),
        block_tokens=block_tokens,
        max_batch_tokens=MAX_BATCH_TOKENS,
        max_running=MAX_BATCH_SIZE,
        chunked_prefill=False,
        priority=False,
        watermark_blocks=0,
        prefill_first=True,
    )


SETUP = PolicySetup(
    "splitwise-baseline",
    ReplicaSizing(shared=False),
    router="token-jsq",
    autoscaler=None,
    model_cache=False,
    admission=False,
    engine_priority=False,
)


def perf_for(
    mode: str, perf_csv: str | Path, spec: ModelSpec, gpu: str, row: ReferenceRow, book: ModelBook | None = None
) -> IterationTimes:
    """The engine timing of ``mode``: the simulator's own rules, or the twin's batch-aware calibrated model, both
    from the model's rows in ``perf_csv`` (or in its own Splitwise-format profile, when ``book`` has one)."""
    grid = (book if book is not None else ModelBook.default()).grid_for(row.model, Path(perf_csv))
    if mode == "compat":
        return SplitwiseCompatPerf.from_csv(grid, row.model, row.hardware.lower(), row.tensor_parallel)
    if mode == "calibrated":
        return calibrated_perf_for(grid, spec, gpu, row.tensor_parallel)
    raise ValueError(f"unknown mode {mode!r} (known: {', '.join(MODES)})")


class _Recorder(Outcomes):
    """Outcomes that also keep every completion (the fidelity metrics need its timestamps)."""

    def __init__(self, models: list[str], targets: dict[SloClass, SloTarget]) -> None:
        super().__init__(models, targets)
        self.completions: list[Completion] = []

    def served(self, c: Completion) -> None:
        super().served(c)
        self.completions.append(c)


class FidelityTwin(Twin):
    """The twin with every replica's engine configured as ``config`` (the engines the policy set-up would build
    are replaced while still idle, before the first request), recording every completion."""

    def __init__(self, inputs: TwinInputs, setup: PolicySetup, config: EngineConfig, seed: int = 0) -> None:
        self.engine_config = config
        super().__init__(inputs, setup, seed)
        self.recorder = _Recorder(list(self.models), inputs.targets)
        self.outcomes = self.recorder

    def _start(self, m: ModelRuntime, preloaded: bool = False) -> Replica | None:
        replica = super()._start(m, preloaded)
        if replica is not None:
            assert replica.engine.idle
            replica.engine = Engine(self.engine_config, m.perf)
        return replica


# ------------------------------------------------------------------------------------------------ the metrics
@dataclass(frozen=True, slots=True)
class RequestTimes:
    """Per served request: arrival, start of its prefill, first token and end (seconds), and its output tokens."""

    arrival: FloatArray
    admitted: FloatArray
    first: FloatArray
    finish: FloatArray
    output_tokens: FloatArray

    @classmethod
    def of(cls, completions: Sequence[Completion]) -> RequestTimes:
        served = [c for c in completions if not c.refused]
        return cls(
            np.array([c.request.arrival_s for c in served], dtype=np.float64),
            np.array([c.admitted_s[0] for c in served], dtype=np.float64),
            np.array([c.first_token_s for c in served], dtype=np.float64),
            np.array([c.finish_s for c in served], dtype=np.float64),
            np.array([c.request.output_tokens for c in served], dtype=np.float64),
        )

    def metric(self, name: str) -> FloatArray:
        if name == "ttft":
            return self.first - self.arrival
        if name == "tbt":
            return (self.finish - self.first) / self.output_tokens
        if name == "e2e":
            return self.finish - self.arrival
        if name == "queue":
            return self.admitted - self.arrival
        raise ValueError(f"unknown metric {name!r}")

    def percentiles(self) -> dict[str, float]:
        """column(metric, pct) -> seconds, percentiles interpolated linearly (as pandas and numpy do)."""
        out: dict[str, float] = {}
        for name in METRICS:
            values = self.metric(name)
            for pct in PERCENTILES:
                out[column(name, pct)] = float(np.percentile(values, pct)) if values.size else math.nan
        return out


@dataclass(frozen=True, slots=True)
class RowResult:
    mode: str
    reference: ReferenceRow
    ours: dict[str, float]
    served: int
    refused: int
    preemptions: int
    wall_s: float
    rel_err_pct: dict[str, float] = field(default_factory=dict)

    @property
    def scored(self) -> bool:
        return not self.reference.saturated

    def max_scored_err_pct(self) -> float:
        keys = [column(m, p) for m in SCORED_METRICS for p in PERCENTILES]
        return max(abs(self.rel_err_pct[k]) for k in keys)


def relative_errors(ours: dict[str, float], reference: dict[str, float]) -> dict[str, float]:
    """100 x (ours - reference) / reference per column (inf when the reference is 0 and ours is not)."""
    out = {}
    for key, ref in reference.items():
        diff = ours[key] - ref
        out[key] = 100.0 * diff / ref if ref else (0.0 if diff == 0 else math.inf)
    return out


def requests_of(trace: TraceArrays, model: str) -> list[InferenceRequest]:
    return [
        InferenceRequest(i, model, float(a), int(p), int(o), SloClass.INTERACTIVE, deadline_s=1e12)
        for i, (a, p, o) in enumerate(zip(trace.arrival_s, trace.prompt_tokens, trace.output_tokens, strict=True))
    ]


def run_row(
    row: ReferenceRow, trace: TraceArrays, perf: IterationTimes, mode: str, book: ModelBook | None = None
) -> RowResult:
    """Replay ``trace`` on the cluster of ``row`` and compare with its reference percentiles."""
    spec, gpu = row_spec(row, book)
    per_server = row.gpus // row.servers
    nodes = [NodeSpec(f"server-{i:03d}", 224_000, 2_048_000, per_server, gpu) for i in range(row.servers)]
    config = engine_config(splitwise_kv_tokens(spec, gpu, row.tensor_parallel))
    inputs = TwinInputs(
        requests=requests_of(trace, spec.name),
        models={spec.name: spec},
        duration_s=trace.duration_s,
        nodes=nodes,
        perf=lambda _spec, _gpu, _tp: perf,
        fixed_replicas={spec.name: row.gpus // row.tensor_parallel},
        targets={c: NEVER_MISSED for c in SloClass},
    )
    started = time.perf_counter()
    twin = FidelityTwin(inputs, SETUP, config)
    twin.run()
    completions = twin.recorder.completions
    ours = RequestTimes.of(completions).percentiles()
    preemptions = sum(r.engine.preemptions for r in twin.fleet.replicas.values())
    refused = sum(1 for c in completions if c.refused)
    return RowResult(
        mode,
        row,
        ours,
        len(completions) - refused,
        refused,
        preemptions,
        time.perf_counter() - started,
        relative_errors(ours, row.values),
    )


Progress = Callable[[str], None]


def compare(
    trace: TraceArrays,
    rows: Sequence[ReferenceRow],
    perf_csv: str | Path,
    modes: Sequence[str] = MODES,
    progress: Progress | None = None,
    book: ModelBook | None = None,
) -> list[RowResult]:
    """One ``RowResult`` per (mode, row), in the order of ``modes`` then ``rows``; ``book``: the models the rows may
    name (``row_spec``)."""
    results = []
    for mode in modes:
        perfs: dict[tuple[str, str, int], IterationTimes] = {}
        for row in rows:
            spec, gpu = row_spec(row, book)
            key = (row.model, row.hardware, row.tensor_parallel)
            if key not in perfs:
                perfs[key] = perf_for(mode, perf_csv, spec, gpu, row, book)
            result = run_row(row, trace, perfs[key], mode, book)
            if progress is not None:
                progress(f"{mode} {row.servers} servers: {result.wall_s:.1f} s")
            results.append(result)
    return results


def max_rel_err_pct(results: Sequence[RowResult]) -> tuple[int, float]:
    """(scored rows, the largest |relative error| in % over their TTFT, TBT and E2E p50/p90/p99)."""
    scored = [r for r in results if r.scored]
    return len(scored), max((r.max_scored_err_pct() for r in scored), default=math.nan)
