"""Gavel's measured throughput tables, loaded into the core's ``ThroughputModel`` and ``ColocationModel``.

The timeline simulator, the ``training`` workload and the CLI call ``load_gavel_models(directory)`` with
``../shared/traces/gavel`` (read by path, never copied; MIT, stanford-futuredata/gavel), or ``default_models()``
when the files are absent. Formats (header required, columns in any order, unknown columns ignored):

- ``gavel_isolated_throughputs.csv``: ``gpu_type,consolidated,job_type,model,batch_size,scale_factor,
  throughput_steps_per_s``;
- ``gavel_colocated_throughputs.csv``: ``gpu_type,consolidated,job_type_a,scale_factor_a,job_type_b,
  scale_factor_b,throughput_a_steps_per_s,throughput_b_steps_per_s,isolated_throughput_a_steps_per_s``.

Only rows of one scale factor (default 1: one GPU per job) and one placement (``consolidated``, default 1) are
kept. A co-location factor is the co-located throughput divided by the isolated one; job B's isolated throughput is
read from the rows where B is job A on the same GPU type. A co-located throughput of 0 (the pair does not fit in
one GPU's memory) is a factor of 0; an isolated throughput of 0 (the job alone does not fit, e.g. ResNet-50 at
batch size 128 on 2+ K80s) leaves that row out of both tables, where the fitted fallbacks cover it. GPU types
``k80``/``p100``/``v100`` become ``K80``/``P100``/``V100M16``.

Every bad value is an ``InputFileError`` naming the path, line and column.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sized
from pathlib import Path

from tessera.core.errors import InputFileError, UnknownGpuModelError
from tessera.core.throughput import (
    DEFAULT_REFERENCE_MODEL,
    ColocationModel,
    ThroughputModel,
    canonical_gpu_model,
)
from tessera.core.throughput_defaults import (  # re-exported: the twin's default tables
    DEFAULT_COLOCATION_FACTORS,
    DEFAULT_ISOLATED_STEPS_PER_S,
    default_models,
)
from tessera.sim.traces.tables import parse_count, read_table

ISOLATED_FILE = "gavel_isolated_throughputs.csv"
COLOCATED_FILE = "gavel_colocated_throughputs.csv"

__all__ = ["DEFAULT_COLOCATION_FACTORS", "DEFAULT_ISOLATED_STEPS_PER_S", "default_models", "load_gavel_models"]

Cell = Callable[[str], str]  # a row's value by column name

ISOLATED_COLUMNS = ("gpu_type", "consolidated", "job_type", "scale_factor", "throughput_steps_per_s")
COLOCATED_COLUMNS = (
    "gpu_type",
    "consolidated",
    "job_type_a",
    "scale_factor_a",
    "job_type_b",
    "scale_factor_b",
    "throughput_a_steps_per_s",
    "throughput_b_steps_per_s",
    "isolated_throughput_a_steps_per_s",
)


def load_gavel_models(
    directory: str | Path | None, *, scale_factor: int = 1, consolidated: bool = True
) -> tuple[ThroughputModel, ColocationModel]:
    """Both models from ``directory``'s two CSV files, or ``default_models()`` when ``directory`` is None."""
    if directory is None:
        return default_models()
    folder = Path(directory)
    throughput = load_throughput_model(folder / ISOLATED_FILE, scale_factor=scale_factor, consolidated=consolidated)
    colocation = load_colocation_model(folder / COLOCATED_FILE, scale_factor=scale_factor, consolidated=consolidated)
    return throughput, colocation


def load_throughput_model(
    path: str | Path,
    *,
    scale_factor: int = 1,
    consolidated: bool = True,
    reference_model: str = DEFAULT_REFERENCE_MODEL,
) -> ThroughputModel:
    """The isolated table's rows of ``scale_factor`` and ``consolidated`` as a ``ThroughputModel``."""
    name = str(path)
    columns, rows = read_table(path, ISOLATED_COLUMNS, "throughputs")
    table: dict[tuple[str, str], float] = {}
    first_line: dict[tuple[str, str], int] = {}
    for line, row in rows:
        cell = _cells(columns, row)
        if not _selected(name, line, cell, ("scale_factor",), scale_factor, consolidated):
            continue
        key = (_text(name, line, "job_type", cell("job_type")), _gpu(name, line, cell("gpu_type")))
        steps_per_s = _number(name, line, "throughput_steps_per_s", cell("throughput_steps_per_s"))
        _check_new(name, line, key, first_line)
        if steps_per_s > 0:  # 0: the job does not fit that GPU at that scale; nothing to fit a speed on
            table[key] = steps_per_s
    _check_any(name, table, scale_factor, consolidated)
    return ThroughputModel(table, reference_model=reference_model)


def load_colocation_model(path: str | Path, *, scale_factor: int = 1, consolidated: bool = True) -> ColocationModel:
    """The co-located table's rows where both jobs have ``scale_factor``, as a ``ColocationModel``."""
    name = str(path)
    columns, rows = read_table(path, COLOCATED_COLUMNS, "co-located throughputs")
    measured: dict[tuple[str, str, str], tuple[float, float, int]] = {}  # key -> (throughput a, throughput b, line)
    isolated: dict[tuple[str, str], float] = {}  # (job, gpu) -> isolated throughput
    for line, row in rows:
        cell = _cells(columns, row)
        if not _selected(name, line, cell, ("scale_factor_a", "scale_factor_b"), scale_factor, consolidated):
            continue
        gpu = _gpu(name, line, cell("gpu_type"))
        job_a = _text(name, line, "job_type_a", cell("job_type_a"))
        job_b = _text(name, line, "job_type_b", cell("job_type_b"))
        key = (job_a, job_b, gpu)
        if key in measured:
            message = f"pair {job_a} + {job_b} on {gpu} given twice (first on line {measured[key][2]})"
            raise InputFileError(name, line, "job_type_b", message)
        throughput_a = _number(name, line, "throughput_a_steps_per_s", cell("throughput_a_steps_per_s"))
        throughput_b = _number(name, line, "throughput_b_steps_per_s", cell("throughput_b_steps_per_s"))
        column = "isolated_throughput_a_steps_per_s"
        isolated[(job_a, gpu)] = _number(name, line, column, cell(column))
        measured[key] = (throughput_a, throughput_b, line)
    _check_any(name, measured, scale_factor, consolidated)
    return ColocationModel(_factors(name, measured, isolated))


def _factors(
    path: str,
    measured: Mapping[tuple[str, str, str], tuple[float, float, int]],
    isolated: Mapping[tuple[str, str], float],
) -> dict[tuple[str, str, str], tuple[float, float]]:
    factors: dict[tuple[str, str, str], tuple[float, float]] = {}
    for (job_a, job_b, gpu), (throughput_a, throughput_b, line) in measured.items():
        alone_b = isolated.get((job_b, gpu))
        if alone_b is None:
            message = f"no isolated throughput for {job_b} on {gpu} (it never appears as job_type_a there)"
            raise InputFileError(path, line, "job_type_b", message)
        alone_a = isolated[(job_a, gpu)]
        if alone_a > 0 and alone_b > 0:  # a job that does not fit alone has no factor to measure
            factors[(job_a, job_b, gpu)] = (throughput_a / alone_a, throughput_b / alone_b)
    return factors


# ---------------------------------------------------------------------------------------------- field values


def _cells(columns: Mapping[str, int], row: list[str]) -> Cell:
    return lambda column: row[columns[column]]


def _selected(
    path: str, line: int, cell: Cell, scale_columns: tuple[str, ...], scale_factor: int, consolidated: bool
) -> bool:
    """Whether the row has the wanted scale factor(s) and placement (checking those values on the way)."""
    scales = [parse_count(path, line, column, cell(column)) for column in scale_columns]
    flag = parse_count(path, line, "consolidated", cell("consolidated"))
    if flag not in (0, 1):
        raise InputFileError(path, line, "consolidated", f"must be 0 or 1, got {flag}")
    return all(scale == scale_factor for scale in scales) and flag == int(consolidated)


def _text(path: str, line: int, column: str, text: str) -> str:
    value = text.strip()
    if not value:
        raise InputFileError(path, line, column, "missing value (a name is required)")
    return value


def _gpu(path: str, line: int, text: str) -> str:
    try:
        return canonical_gpu_model(_text(path, line, "gpu_type", text))
    except UnknownGpuModelError as exc:
        raise InputFileError(path, line, "gpu_type", exc.message) from exc


def _number(path: str, line: int, column: str, text: str, *, positive: bool = False) -> float:
    try:
        value = float(text.strip())
    except ValueError:
        raise InputFileError(path, line, column, f"{text.strip()!r} is not a number") from None
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        bound = "> 0" if positive else ">= 0"
        raise InputFileError(path, line, column, f"must be a finite number {bound}, got {text.strip()}")
    return value


def _check_new(path: str, line: int, key: tuple[str, str], first_line: dict[tuple[str, str], int]) -> None:
    if key in first_line:
        message = f"{key[0]} on {key[1]} given twice (first on line {first_line[key]})"
        raise InputFileError(path, line, "job_type", message)
    first_line[key] = line


def _check_any(path: str, table: Sized, scale_factor: int, consolidated: bool) -> None:
    if len(table) == 0:
        wanted = f"scale_factor {scale_factor} and consolidated {int(consolidated)}"
        raise InputFileError(path, None, "scale_factor", f"no rows with {wanted}")
