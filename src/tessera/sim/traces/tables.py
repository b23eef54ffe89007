"""Reading the simulator's CSV and text input files, with every problem an ``InputFileError`` (path, line, column).

The loaders of every file format the simulator reads by path use these: the openb node and pod lists
(``tessera.sim.traces.openb``), and the workload models' tables (Gavel's throughputs, Philly's runtimes, the PAI
machine list) and JSON files (``tessera.sim.workloads``). ``read_table`` wants a header (columns in any order,
matched lower-cased, unknown columns kept out of the way) and at least one data row; ``parse_count`` reads a
non-negative integer cell.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Callable, Iterator, Sequence
from operator import itemgetter
from pathlib import Path
from typing import Protocol

from tessera.core.errors import InputFileError
from tessera.textfiles import read_text_file

_INT_RE = re.compile(r"\s*([+-]?[0-9]+)\s*")

Row = list[str]
Getter = Callable[[Row], str]


class _LineReader(Protocol):
    """What ``csv.reader`` returns, as far as this module uses it."""

    @property
    def line_num(self) -> int: ...

    def __iter__(self) -> Iterator[Row]: ...


# ----------------------------------------------------------------------------------------------- reading CSV


def read_text(path: str | Path) -> str:
    """The file's text (UTF-8, a leading BOM dropped); unreadable or undecodable files become ``InputFileError``."""
    try:
        return read_text_file(Path(path))
    except OSError as exc:
        raise InputFileError(str(path), None, None, f"cannot read the file: {exc.strerror or exc}") from exc


def read_table(path: str | Path, required: Sequence[str], what: str) -> tuple[dict[str, int], list[tuple[int, Row]]]:
    """Column index by (lower-cased) name and the data rows with their line numbers; checks shape, not values."""
    name = str(path)
    reader = csv.reader(io.StringIO(read_text(path), newline=""))
    try:
        header = next(reader, None)
        if header is None:
            raise InputFileError(name, None, None, f"empty file: no header and no {what}")
        columns = _header_columns(name, header, required)
        rows = _data_rows(name, reader, len(header))
    except csv.Error as exc:
        raise InputFileError(name, reader.line_num or None, None, f"bad CSV: {exc}") from exc
    if not rows:
        raise InputFileError(name, 1, None, f"no {what}: the file has a header but no data rows")
    return columns, rows


def _header_columns(path: str, header: Row, required: Sequence[str]) -> dict[str, int]:
    columns: dict[str, int] = {}
    for index, raw in enumerate(header):
        column = raw.strip().lower()
        if column in columns:
            raise InputFileError(path, 1, column, "the column appears twice in the header")
        columns[column] = index
    found = ", ".join(c for c in columns if c) or "none"
    for column in required:
        if column not in columns:
            raise InputFileError(path, 1, column, f"required column missing (columns found: {found})")
    return columns


def _data_rows(path: str, reader: _LineReader, width: int) -> list[tuple[int, Row]]:
    rows: list[tuple[int, Row]] = []
    for row in reader:
        if not row:
            continue  # a blank line
        line = reader.line_num  # the record's last physical line: its own line unless a quoted field spans lines
        if len(row) != width:
            raise InputFileError(path, line, None, f"{len(row)} fields but the header has {width}")
        rows.append((line, row))
    return rows


def column_getter(columns: dict[str, int], column: str) -> Getter:
    """A fast accessor for ``column`` of a row; an absent optional column reads as empty."""
    index = columns.get(column)
    if index is None:
        return lambda _row: ""
    get: Getter = itemgetter(index)
    return get


def parse_count(path: str, line: int, column: str, text: str) -> int:
    """A non-negative integer cell, or an ``InputFileError`` naming path, line and column (shared by all loaders)."""
    match = _INT_RE.fullmatch(text)
    if match is None:
        if not text.strip():
            raise InputFileError(path, line, column, "missing value (an integer is required)")
        raise InputFileError(path, line, column, f"{text.strip()!r} is not an integer")
    value = int(match.group(1))
    if value < 0:
        raise InputFileError(path, line, column, f"must be >= 0, got {value}")
    return value
