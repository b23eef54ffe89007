"""Readers of the performance model's input files, with errors that name the file, the line and the field.

- The Splitwise characterization grid (``../shared/traces/splitwise/perf_model.csv``): one row per measured run,
  ``model,hardware,prompt_size,batch_size,token_size,...,prompt_time,token_time,...,tensor_parallel`` (times in
  milliseconds: ``prompt_time`` is the prefill of ``batch_size`` prompts of ``prompt_size`` tokens, ``token_time``
  the mean decode step while they generate ``token_size`` tokens). Extra columns are ignored.
- A user profile (``ProfilePerf``): ``kind,batch_size,tokens,kv_tokens,time_ms`` where ``kind`` is ``prefill`` (an
  iteration processing ``tokens`` prompt tokens of ``batch_size`` prompts; ``kv_tokens`` ignored) or ``decode`` (a
  step of ``batch_size`` sequences whose contexts hold ``kv_tokens`` tokens in all; ``tokens`` ignored and may be
  empty). Blank lines and lines starting with ``#`` are skipped; repeated measurements are combined by median.

Both raise ``InputFileError(path, line, field, message)``; line 1 is the header.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tessera.core.errors import InputFileError

SPLITWISE_COLUMNS = (
    "model",
    "hardware",
    "tensor_parallel",
    "prompt_size",
    "batch_size",
    "token_size",
    "prompt_time",
    "token_time",
)
PROFILE_COLUMNS = ("kind", "batch_size", "tokens", "kv_tokens", "time_ms")


@dataclass(frozen=True, slots=True)
class SplitwiseRow:
    line: int
    model: str
    hardware: str
    tensor_parallel: int
    prompt_size: int
    batch_size: int
    token_size: int
    prompt_time_ms: float
    token_time_ms: float

    @property
    def config(self) -> tuple[str, str, int]:
        return (self.model, self.hardware, self.tensor_parallel)

    @property
    def batch_tokens(self) -> int:
        return self.prompt_size * self.batch_size


@dataclass(frozen=True, slots=True)
class ProfileRow:
    line: int
    kind: str  # "prefill" or "decode"
    batch_size: int
    tokens: int
    kv_tokens: int
    time_ms: float


def _records(path: Path, required: tuple[str, ...]) -> Iterator[tuple[int, dict[str, str]]]:
    """(line number in the file, row) for each data row, after checking that the header names every required
    column. Blank lines and ``#`` comment lines are skipped but counted, so that line numbers are the file's."""
    name = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise InputFileError(name, None, None, f"cannot read: {err}") from None
    header: list[str] | None = None
    for line, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip() or raw.lstrip().startswith("#"):
            continue
        fields = [f.strip() for f in next(csv.reader([raw]))]
        if header is None:
            header = fields
            for column in required:
                if column not in header:
                    raise InputFileError(name, line, column, f"missing column (the header has: {', '.join(header)})")
            continue
        if len(fields) != len(header):
            raise InputFileError(name, line, None, f"{len(fields)} fields where the header has {len(header)}")
        yield line, dict(zip(header, fields, strict=True))
    if header is None:
        raise InputFileError(name, None, None, "empty file: no header")


def _integer(path: Path, line: int, row: dict[str, str], field: str, minimum: int) -> int:
    text = row[field].strip()
    try:
        value = int(text)
    except ValueError:
        raise InputFileError(str(path), line, field, f"not an integer: {text!r}") from None
    if value < minimum:
        raise InputFileError(str(path), line, field, f"must be >= {minimum}, got {value}")
    return value


def _positive(path: Path, line: int, row: dict[str, str], field: str) -> float:
    text = row[field].strip()
    try:
        value = float(text)
    except ValueError:
        raise InputFileError(str(path), line, field, f"not a number: {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise InputFileError(str(path), line, field, f"must be a positive finite number, got {text}")
    return value


def read_splitwise_rows(path: str | Path) -> list[SplitwiseRow]:
    """Every row of a Splitwise perf-model CSV, validated."""
    source = Path(path)
    rows: list[SplitwiseRow] = []
    for line, row in _records(source, SPLITWISE_COLUMNS):
        for field in ("model", "hardware"):
            if not row[field].strip():
                raise InputFileError(str(source), line, field, "empty")
        rows.append(
            SplitwiseRow(
                line=line,
                model=row["model"].strip(),
                hardware=row["hardware"].strip(),
                tensor_parallel=_integer(source, line, row, "tensor_parallel", 1),
                prompt_size=_integer(source, line, row, "prompt_size", 1),
                batch_size=_integer(source, line, row, "batch_size", 1),
                token_size=_integer(source, line, row, "token_size", 1),
                prompt_time_ms=_positive(source, line, row, "prompt_time"),
                token_time_ms=_positive(source, line, row, "token_time"),
            )
        )
    if not rows:
        raise InputFileError(str(source), None, None, "no data rows")
    return rows


def select_config(path: str | Path, rows: list[SplitwiseRow], model: str, hardware: str, tp: int) -> list[SplitwiseRow]:
    """The rows of one (model, hardware, tensor_parallel); an error listing what the file has otherwise."""
    chosen = [r for r in rows if r.config == (model, hardware, tp)]
    if chosen:
        return chosen
    have = sorted({r.config for r in rows})
    listed = "; ".join(f"{m} {h} tp{t}" for m, h, t in have)
    field = "model" if all(m != model for m, _, _ in have) else "hardware"
    if field == "hardware" and any(m == model and h == hardware for m, h, _ in have):
        field = "tensor_parallel"
    raise InputFileError(
        str(path), None, field, f"no rows for {model} on {hardware} with tp{tp} (the file has: {listed})"
    )


def read_profile_rows(path: str | Path) -> list[ProfileRow]:
    """Every row of a user profile, validated (see the module docstring for the format)."""
    source = Path(path)
    rows: list[ProfileRow] = []
    for line, row in _records(source, PROFILE_COLUMNS):
        kind = row["kind"].strip().lower()
        if kind not in ("prefill", "decode"):
            raise InputFileError(str(source), line, "kind", f"must be prefill or decode, got {row['kind']!r}")
        if kind == "decode" and not row["tokens"].strip():
            row = {**row, "tokens": "0"}  # a decode row's tokens column is ignored and may be empty
        rows.append(
            ProfileRow(
                line=line,
                kind=kind,
                batch_size=_integer(source, line, row, "batch_size", 1),
                tokens=_integer(source, line, row, "tokens", 1 if kind == "prefill" else 0),
                kv_tokens=_integer(source, line, row, "kv_tokens", 0) if row["kv_tokens"].strip() else 0,
                time_ms=_positive(source, line, row, "time_ms"),
            )
        )
    for kind in ("prefill", "decode"):
        if not any(r.kind == kind for r in rows):
            raise InputFileError(str(source), None, "kind", f"no {kind} rows: a profile needs both kinds")
    return rows
