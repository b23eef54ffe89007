"""Workload logs as the API serves them: byte offsets that survive rotation, whole UTF-8 characters, the last N
lines, and a size cap.

A workload writes its log through the file descriptor it was started with (``O_APPEND``: ``backends.local_exec``),
so the file cannot be renamed under it. Rotation is therefore *copy and truncate*, done by the server: when
``<id>.log`` passes ``max_bytes`` its content is copied to ``<id>.log.1`` (replacing the previous one) and the file
is truncated; the workload's next write lands at the start of the emptied file. So a log takes at most about twice
``max_bytes`` on disk (the current file and one rotated copy), and what was written before the rotated copy is gone.
Bytes written in the instant between the copy and the truncation are lost (the copy is repeated until it caught up
with the file, so that window is a few microseconds; ``logrotate``'s ``copytruncate`` has the same limit).

Offsets are *logical*: the byte position in everything the workload ever wrote. ``<id>.log.base`` holds the logical
offset of the current file's first byte (absent: 0), so a client following with ``next_offset`` is never sent
back to the start by a rotation; asking for an offset that was rotated away answers from the oldest byte kept.
Reads and rotations of this process take one lock, so a reader never sees the files halfway through a rotation.

A chunk never ends inside a UTF-8 character: an incomplete multi-byte sequence at its end is left for the next read
(unless the workload has ended and it is the last byte of the log: then it is decoded with a replacement
character), so a character split by the chunk size or by a write in progress arrives whole.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from tessera.errors import InvalidRequestError

log = logging.getLogger(__name__)

DEFAULT_LOG_MAX_BYTES = 64 * 1024 * 1024  # per workload log before it is rotated (tessera up --log-max-size)
ROTATE_EVERY_S = 2.0
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


def complete_utf8(data: bytes) -> int:
    """The length of ``data`` without a trailing incomplete UTF-8 sequence (a lead byte whose continuation bytes
    have not arrived yet). Invalid bytes are kept: they are decoded with replacement characters, never held back."""
    n = len(data)
    for back in range(1, min(4, n) + 1):
        byte = data[n - back]
        if byte < 0x80:  # ASCII: the end is complete
            return n
        if byte >= 0xC0:  # a lead byte: how many bytes its character has
            size = 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
            return n - back if back < size else n
    return n


class LogFiles:
    """The logs of ``directory`` (``<id>.log``, ``<id>.log.1``, ``<id>.log.base``) with a cap of ``max_bytes`` per
    file (0: no cap)."""

    def __init__(self, path_of: Callable[[int], Path], max_bytes: int = DEFAULT_LOG_MAX_BYTES) -> None:
        if max_bytes < 0:
            raise ValueError("max_bytes must be >= 0")
        self.path_of = path_of
        self.max_bytes = max_bytes
        self._lock = threading.Lock()

    # ----------------------------------------------------------------------------------------------- reading

    def read(self, workload_id: int, offset: int, limit: int, finished: bool) -> LogRead:
        """Up to ``limit`` bytes from logical ``offset`` (whole characters; see the module's doc). At least 4 bytes
        are read, so that one character always fits."""
        limit = max(limit, 4)
        path = self.path_of(workload_id)
        with self._lock:
            base = _base(path)
            rotated = _size(_rotated(path))
            oldest = base - rotated
            offset = max(offset, oldest)
            if offset < base:  # still in the rotated copy
                data = _read_at(_rotated(path), offset - oldest, min(limit, base - offset))
                at_end = False
            else:
                data = _read_at(path, offset - base, limit)
                at_end = len(data) < limit
        keep = complete_utf8(data)
        if keep < len(data) and (finished and at_end and keep == 0):
            keep = len(data)  # the log's last bytes, and no more will come
        return LogRead(data[:keep], offset, offset + keep)

    def tail_offset(self, workload_id: int, lines: int) -> int:
        """The logical offset where the last ``lines`` lines start (a last line without its newline counts)."""
        path = self.path_of(workload_id)
        with self._lock:
            base = _base(path)
            found = _tail_in(path, lines)
            if found is not None:
                return base + found
            older = _tail_in(_rotated(path), lines - _count_lines(path))
            return base - _size(_rotated(path)) + (older or 0)

    # ---------------------------------------------------------------------------------------------- rotation

    def rotate(self, workload_ids: Iterable[int]) -> list[int]:
        """Rotate the logs of ``workload_ids`` that passed the cap; returns the ids rotated."""
        if self.max_bytes == 0:
            return []
        done = []
        for workload_id in workload_ids:
            path = self.path_of(workload_id)
            if _size(path) <= self.max_bytes:
                continue
            try:
                with self._lock:
                    _copy_truncate(path)
            except OSError as error:
                log.warning("cannot rotate %s: %s", path, error)
                continue
            done.append(workload_id)
        return done

    def keep_rotating(self, stopping: Callable[[], bool], running: Callable[[], Iterable[int]]) -> threading.Thread:
        """A daemon thread that rotates the logs of the ``running`` workloads every few seconds until ``stopping``."""

        wake = threading.Event()

        def run() -> None:
            while not stopping():
                with contextlib.suppress(RuntimeError):  # the running table changed while it was read: next round
                    self.rotate(running())
                wake.wait(ROTATE_EVERY_S)

        thread = threading.Thread(target=run, name="tessera-log-rotation", daemon=True)
        thread.start()
        return thread


def _rotated(path: Path) -> Path:
    return path.with_name(path.name + ".1")


def _base_path(path: Path) -> Path:
    return path.with_name(path.name + ".base")


def _base(path: Path) -> int:
    try:
        return int(_base_path(path).read_text().strip() or 0)
    except (OSError, ValueError):
        return 0


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _read_at(path: Path, offset: int, limit: int) -> bytes:
    try:
        with path.open("rb") as f:
            if offset >= os.fstat(f.fileno()).st_size:  # seeking past the file system's limit fails (EINVAL)
                return b""
            f.seek(offset)
            return f.read(limit)
    except FileNotFoundError:
        return b""


def _copy_truncate(path: Path) -> None:
    """Copy ``path`` to its rotated name and empty it; the base moves on by what was copied."""
    temporary = path.with_name(path.name + ".rotating")
    with path.open("rb") as source, temporary.open("wb") as target:
        shutil.copyfileobj(source, target)
        while chunk := source.read(1 << 20):  # caught up with what was appended during the copy
            target.write(chunk)
        copied = target.tell()
        os.truncate(path, 0)
    os.replace(temporary, _rotated(path))
    base = _base(path) + copied
    staged = _base_path(path).with_name(_base_path(path).name + ".tmp")
    staged.write_text(f"{base}\n")
    os.replace(staged, _base_path(path))


def _tail_in(path: Path, lines: int) -> int | None:
    """The offset where the last ``lines`` lines of ``path`` start, or None when it holds fewer."""
    if lines <= 0:
        return _size(path)
    try:
        f = path.open("rb")
    except FileNotFoundError:
        return None
    with f:
        end = os.fstat(f.fileno()).st_size
        position, wanted, first = end, lines, True
        while position > 0:
            start = max(0, position - _TAIL_BLOCK)
            f.seek(start)
            block = f.read(position - start)
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
                    return start + newline + 1
                cut = newline
            position = start
        return None


def _count_lines(path: Path) -> int:
    """Lines of ``path`` (a last line without its newline counts)."""
    try:
        with path.open("rb") as f:
            count, last = 0, b"\n"
            while block := f.read(1 << 20):
                count += block.count(b"\n")
                last = block[-1:]
            return count + (last != b"\n")
    except FileNotFoundError:
        return 0
