"""Workload logs as the API serves them: byte offsets that survive rotation, whole UTF-8 characters, the last N
lines. Reading only: the cap is enforced where the bytes are written (``backends.capped_log``: the workload's
supervisor, or the Ray backend as it appends), which rotates by rename; so a reader takes no lock and a rotation never
holds it up, and a log takes at most about twice ``tessera up --log-max-size`` on disk.

Offsets are *logical*: the byte position in everything the workload ever wrote. ``<id>.log.base`` holds the logical
offset of the current file's first byte (absent: 0), so a client following with ``next_offset`` is never sent
back to the start by a rotation; asking for an offset that was rotated away answers from the oldest byte kept.
Each read looks at a consistent pair of files (``capped_log.open_segments``), whatever rotation happens meanwhile.

A gang's ranks log apart (``backends.base.rank_log_path``: rank 0 in the workload's log, rank ``r`` in
``<id>.log.rank<r>``, each capped and rotated alike): every read names its ``rank`` (0 by default).

A chunk never ends inside a UTF-8 character: an incomplete multi-byte sequence at its end is left for the next read
(unless the workload has ended and it is the last byte of the log: then it is decoded with a replacement
character), so a character split by the chunk size or by a write in progress arrives whole. (The writer never ends a
file inside a character, so a chunk read from the rotated file is whole.)
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from tessera.backends.base import rank_log_path
from tessera.backends.capped_log import DEFAULT_LOG_MAX_BYTES, Segments, complete_utf8, open_segments, rotated_path
from tessera.errors import InvalidRequestError

__all__ = ["DEFAULT_LOG_MAX_BYTES", "LogFiles", "LogRead", "complete_utf8", "parse_size_bytes"]
_TAIL_BLOCK = 64 * 1024


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B?|B)?\s*$", re.IGNORECASE)
_SIZE_UNITS = {"": 1, "b": 1, "k": 1000, "m": 1000**2, "g": 1000**3, "t": 1000**4}


def parse_size_bytes(text: str, field: str) -> int:
    """Bytes in ``64MiB``, ``1GiB``, ``500K``, ``1048576`` or ``0`` (binary with ``i``, decimal without)."""
    match = _SIZE.match(text)
    if match is None:
        raise InvalidRequestError(field, f"{text!r} is not a size (examples: 64MiB, 1GiB, 0 for no cap)")
    unit = (match.group(2) or "").lower().rstrip("b")
    factor = 1024 ** ("kmgt".index(unit[0]) + 1) if unit.endswith("i") else _SIZE_UNITS[unit]
    return int(float(match.group(1)) * factor)


@dataclass(frozen=True, slots=True)
class LogRead:
    data: bytes
    offset: int  # logical offset of data's first byte
    next_offset: int


class LogFiles:
    """The logs named by ``path_of`` (``<id>.log``, ``<id>.log.1``, ``<id>.log.base``), read as one stream."""

    def __init__(self, path_of: Callable[[int], Path]) -> None:
        self.path_of = path_of

    def path(self, workload_id: int, rank: int = 0) -> Path:
        """The log of ``workload_id``'s rank ``rank`` (0: the workload's log)."""
        return rank_log_path(self.path_of(workload_id), rank)

    def has_rank(self, workload_id: int, rank: int) -> bool:
        """Whether rank ``rank`` of ``workload_id`` has a log (rank 0 always: the workload's log, perhaps empty)."""
        path = self.path(workload_id, rank)
        return rank == 0 or path.exists() or rotated_path(path).exists()

    def read(self, workload_id: int, offset: int, limit: int, finished: bool, rank: int = 0) -> LogRead:
        """Up to ``limit`` bytes from logical ``offset`` (whole characters; see the module's doc) of rank ``rank``'s
        log. At least 4 bytes are read, so that one character always fits."""
        limit = max(limit, 4)
        with open_segments(self.path(workload_id, rank)) as segments:
            offset = max(offset, segments.rotated_start)
            if offset < segments.current_start:  # still in the rotated file, which is final
                data = _read_at(segments.rotated, offset - segments.rotated_start, limit)
                final = offset + len(data) >= segments.current_start
            else:
                data = _read_at(segments.current, offset - segments.current_start, limit)
                final = finished and len(data) < limit
        keep = complete_utf8(data)
        if keep < len(data) and final and keep == 0:
            keep = len(data)  # a file's last bytes, and no more will come to it
        return LogRead(data[:keep], offset, offset + keep)

    def tail_offset(self, workload_id: int, lines: int, rank: int = 0) -> int:
        """The logical offset where the last ``lines`` lines of rank ``rank``'s log start (a last line without its
        newline counts)."""
        with open_segments(self.path(workload_id, rank)) as segments:
            return _tail_offset(segments, lines)


def _tail_offset(segments: Segments, lines: int) -> int:
    found, counted = _tail_in(segments.current, lines)
    if found is not None:
        return segments.current_start + found
    older, _ = _tail_in(segments.rotated, lines - counted)
    return segments.rotated_start + (older or 0)


def _read_at(handle: IO[bytes] | None, offset: int, limit: int) -> bytes:
    if handle is None or offset >= os.fstat(handle.fileno()).st_size:  # seeking past the limit fails (EINVAL)
        return b""
    handle.seek(offset)
    return handle.read(limit)


def _tail_in(handle: IO[bytes] | None, lines: int) -> tuple[int | None, int]:
    """(The offset where the last ``lines`` lines of the file start, or None when it holds fewer; the lines it holds
    when fewer, else ``lines``: a last line without its newline counts.) Reads the file from its end, once."""
    if handle is None:
        return None, 0
    end = os.fstat(handle.fileno()).st_size
    if lines <= 0:
        return end, 0
    position, wanted, first = end, lines, True
    while position > 0:
        start = max(0, position - _TAIL_BLOCK)
        handle.seek(start)
        block = handle.read(position - start)
        cut = len(block)
        if first and block.endswith(b"\n"):
            cut -= 1  # the newline that ends the last line does not start another
        first = False
        while True:
            newline = block.rfind(b"\n", 0, cut)
            if newline < 0:
                break
            wanted -= 1
            if wanted == 0:
                return start + newline + 1, lines
            cut = newline
        position = start
    return None, lines - wanted + (end > 0)  # each newline found starts a line; the first line starts the file
