"""A workload's log with its size cap enforced where the bytes are written, and rotation by rename, so that a reader
is never held up by a rotation.

Files of a log ``<id>.log``: the current file; ``<id>.log.1``, the one before (replaced at each rotation); and
``<id>.log.base``, ``"<B> <inode>"``: the logical offset ``B`` (the count of every byte the workload wrote before)
of the first byte of the current file, whose inode is ``<inode>``. A file ``"<B>"`` alone (older servers) or no file
(``B`` = 0, never rotated) names no inode.

**The writer** (``CappedLog``: the workload's supervisor, which copies the command's output from a pipe; the Ray
backend's server side, which appends what the actor sends) rotates *before* a write that would take the current file
past ``max_bytes``: it renames the current file to ``.1``, creates a new one and then records the new base with the
new file's inode (a log never rotated has no base file: its base, 0 and its inode, is recorded before the rename).
So the current file never holds more than ``max_bytes`` (a single write larger than the cap goes whole into a file
of its own), a log takes at most about twice ``max_bytes`` on disk, and nothing is copied. A trailing, unfinished
UTF-8 character of a write is held back until its last byte comes, so that no file ends inside a character (readers
decode file by file).

**Readers** (``open_segments``) need no lock: the inode in the base file tells which file the base belongs to. Seen
between the rename and the base's update (or after a writer killed there), the current file is not the recorded one
and ``.1`` is: then ``.1`` starts at ``B`` and the current file at ``B + size(.1)``. A reader that raced a whole
rotation (the files changed between its looks) looks again.

Imports only the standard library: the supervisor uses it.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

DEFAULT_LOG_MAX_BYTES = 64 * 1024 * 1024  # per log file before it is rotated (tessera up --log-max-size)
_SNAPSHOT_TRIES = 20
_RETRY_S = 0.001


def rotated_path(path: Path) -> Path:
    return path.with_name(path.name + ".1")


def base_path(path: Path) -> Path:
    return path.with_name(path.name + ".base")


def read_base(path: Path) -> tuple[int, int | None]:
    """(logical offset, inode) the base file records for the log ``path``: (0, None) when there is none."""
    try:
        fields = base_path(path).read_text().split()
        return int(fields[0]), int(fields[1]) if len(fields) > 1 else None
    except (OSError, ValueError, IndexError):
        return 0, None


def write_base(path: Path, base: int, inode: int) -> None:
    """Records atomically that the file of ``inode`` (the current one) starts at logical offset ``base``."""
    staged = base_path(path).with_name(base_path(path).name + ".tmp")
    with open(os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as handle:
        handle.write(f"{base} {inode}\n")
    os.replace(staged, base_path(path))


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


@dataclass(frozen=True, slots=True)
class Segments:
    """A consistent view of a log: the rotated and the current file (open, or None when missing) and where each
    starts in the logical offsets. The current file may grow while it is read; the rotated one does not change."""

    rotated: IO[bytes] | None
    rotated_start: int  # logical offset of the rotated file's first byte
    current: IO[bytes] | None
    current_start: int  # = rotated_start + the rotated file's size

    def current_size(self) -> int:
        return 0 if self.current is None else os.fstat(self.current.fileno()).st_size


@contextlib.contextmanager
def open_segments(path: Path) -> Iterator[Segments]:
    """The log's files, open, with their logical starts (see the module's doc); closed on leaving."""
    segments = _snapshot(path)
    try:
        yield segments
    finally:
        for handle in (segments.current, segments.rotated):
            if handle is not None:
                handle.close()


def _snapshot(path: Path) -> Segments:
    """Opens the files until they are seen unchanged from before to after (rotations take microseconds); after
    ``_SNAPSHOT_TRIES`` the base is taken as it is recorded."""
    for attempt in range(_SNAPSHOT_TRIES):
        last = attempt == _SNAPSHOT_TRIES - 1
        recorded = read_base(path)
        current, rotated = _open_or_none(path), _open_or_none(rotated_path(path))
        segments = _segments_of(recorded, current, rotated, trust_base=last)
        if segments is not None and (last or (read_base(path) == recorded and _same_files(path, current, rotated))):
            return segments
        for handle in (current, rotated):
            if handle is not None:
                handle.close()
        time.sleep(_RETRY_S)  # a rotation under way: it takes microseconds
    raise AssertionError("unreachable: the last try trusts the base")


def _segments_of(
    recorded: tuple[int, int | None], current: IO[bytes] | None, rotated: IO[bytes] | None, trust_base: bool
) -> Segments | None:
    """The segments by the recorded base, or None when the files do not fit it (a rotation under way elsewhere)."""
    base, inode = recorded
    rotated_size = 0 if rotated is None else os.fstat(rotated.fileno()).st_size
    current_inode = None if current is None else os.fstat(current.fileno()).st_ino
    rotated_inode = None if rotated is None else os.fstat(rotated.fileno()).st_ino
    if inode is not None and current_inode != inode and rotated_inode == inode:
        return Segments(rotated, base, current, base + rotated_size)  # renamed, the new base not recorded yet
    if inode is None or current_inode == inode or trust_base:  # the usual case: the base is the current file's
        return Segments(rotated, base - rotated_size, current, base)
    return None


def _open_or_none(path: Path) -> IO[bytes] | None:
    try:
        return path.open("rb")
    except FileNotFoundError:
        return None


def _same_files(path: Path, current: IO[bytes] | None, rotated: IO[bytes] | None) -> bool:
    """True while ``path`` and its rotated name still name the files that were opened."""
    for name, handle in ((path, current), (rotated_path(path), rotated)):
        try:
            inode = name.stat().st_ino
        except FileNotFoundError:
            inode = None
        if inode != (None if handle is None else os.fstat(handle.fileno()).st_ino):
            return False
    return True


class CappedLog:
    """Appends to the log ``path``, rotating before the current file would pass ``max_bytes`` (0: never). ``fd``:
    the current file, already open for appending (the supervisor's stdout, opened by the server); else it is opened
    (created 0600). Not thread-safe: one writer per log."""

    def __init__(self, path: Path, max_bytes: int, fd: int | None = None) -> None:
        if max_bytes < 0:
            raise ValueError("max_bytes must be >= 0")
        self.path = path
        self.max_bytes = max_bytes
        self.fd = fd if fd is not None else _open_append(path)
        self.size = os.fstat(self.fd).st_size
        self._held = b""  # the start of a UTF-8 character whose end has not come yet
        self.dropped_bytes = 0  # what could not be written (a full disk...)
        with open_segments(path) as segments:  # the base of this file, also after a rotation cut short
            self.base = segments.current_start
        self._recorded = read_base(path) == (self.base, os.fstat(self.fd).st_ino)  # else recorded at need
        if not self._recorded and (self.base or self.size):
            self._record_base()

    def write(self, data: bytes) -> None:
        """Writes ``data`` (but a trailing unfinished character, kept for the next write)."""
        data = self._held + data
        keep = complete_utf8(data)
        data, self._held = data[:keep], data[keep:]
        self._put(data)

    def flush_held(self) -> None:
        """Writes what ``write`` held back (the output ended inside a character: no more of it will come)."""
        held, self._held = self._held, b""
        self._put(held)

    def rotate(self) -> bool:
        """The current file becomes ``.1`` (replacing it) and a new, empty one the current file; False when that
        failed (the log's directory is gone...). A log never rotated has no base file yet: its base (0 and this
        file's inode) is recorded first, so that a reader between the rename and the new base (or after a writer
        killed there) finds the renamed file by its inode."""
        if not self._recorded:
            self._record_base()
        try:
            os.replace(self.path, rotated_path(self.path))
            fd = _open_append(self.path)
        except OSError:
            return False
        old_fd, self.fd = self.fd, fd
        self.base += self.size
        self.size = 0
        os.close(old_fd)
        self._record_base()
        return True

    def close(self) -> None:
        self.flush_held()
        with contextlib.suppress(OSError):
            os.close(self.fd)

    def _record_base(self) -> None:
        with contextlib.suppress(OSError):
            write_base(self.path, self.base, os.fstat(self.fd).st_ino)
            self._recorded = True

    def _put(self, data: bytes) -> None:
        if not data:
            return
        if self.max_bytes and self.size and self.size + len(data) > self.max_bytes and not self.rotate():
            self.dropped_bytes += len(data)  # the cap holds even when the log cannot rotate
            return
        view = memoryview(data)
        while view:
            try:
                written = os.write(self.fd, view)
            except OSError:
                self.dropped_bytes += len(view)
                return
            self.size += written
            view = view[written:]


def _open_append(path: Path) -> int:
    return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)


def logical_size(path: Path) -> int:
    """Every byte ever written to the log ``path``, rotated ones included."""
    with open_segments(path) as segments:
        return segments.current_start + segments.current_size()
