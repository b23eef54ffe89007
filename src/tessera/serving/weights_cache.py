"""A model's weights in the host's page cache: how much of them is there, reading them in, letting them go.

This is the live warm tier on a host whose engines restart from files (on the CPU, or any engine without a sleep
mode): a replica started while its weights are in the page cache skips the disk. ``resident_fraction`` asks the
kernel (``mincore`` over a read-only mapping of each file, no page touched); ``prefetch`` reads the files through
once, sequentially, so that they are; ``drop`` tells the kernel it may forget them (``POSIX_FADV_DONTNEED``: clean
pages go at once, pages still being written back stay). The weights are a file or every regular file under a
folder (``.safetensors``, ``.bin``, ``.gguf``, the tokenizer and config files), symlinks followed, never leaving
that folder's tree through a link.

The path is a tenant's word, so the work is bounded whatever it names (``NotWeights`` beyond the bounds):

- a walk looks at most at ``MAX_ENTRIES`` directory entries and keeps at most ``MAX_FILES`` files (``"/"`` ends
  there), and never enters ``/proc``, ``/sys`` or ``/dev``, nor takes ``/`` itself as weights (nor a path whose
  links lead there);
- reading in and measuring stop at the sizes the scan found (a file grown since is not read further);
- a file mostly made of holes (a sparse file: allocated blocks under half its size) is not weights: its apparent
  size would cost work and memory for nothing;
- ``mincore`` runs over one window of ``WINDOW_BYTES`` at a time (its vector is 1/4096 of the window: 256 KiB),
  so memory does not grow with a file's size, and over at most ``MAX_MEASURED_BYTES`` in all: beyond that, windows
  spread evenly over the files are measured and the fraction is theirs (a sample).

The caller decides whose permissions apply: the server's model-cache keeper scans and opens the files as the
tenant's OS account (``server.as_tenant``), so a path the tenant may not read is not read, then measures, reads and
lets go through the descriptors it opened (``OpenWeights``).
"""

from __future__ import annotations

import ctypes
import mmap
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

READ_CHUNK = 8 << 20
MAX_ENTRIES = 20_000  # directory entries one walk looks at
MAX_FILES = 1024  # files of one model's weights (each held open while it is measured: tessera up raises its limit)
WINDOW_BYTES = 1 << 30  # one mincore call's span
MAX_MEASURED_BYTES = 64 << 30  # bytes one measurement asks mincore about, at most
SYSTEM_TREES = (Path("/proc"), Path("/sys"), Path("/dev"))  # never weights, never walked

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
_MAP_FAILED = ctypes.c_void_p(-1).value
_LOW_BIT = bytes(b & 1 for b in range(256))  # mincore's vector: the low bit of each byte says "resident"


class NotWeights(ValueError):
    """The path is not a model's weights within the bounds (module docstring); the message says why."""


@dataclass(frozen=True, slots=True)
class WeightFiles:
    files: tuple[Path, ...]  # largest first
    sizes: tuple[int, ...]  # each file's size in bytes

    @property
    def total_bytes(self) -> int:
        return sum(self.sizes)


def scan(path: str | Path) -> WeightFiles:
    """The weights at ``path`` (no files when there is nothing there); ``NotWeights`` past the bounds."""
    root = Path(os.path.abspath(path))
    for named in (root, root.resolve()):  # as given, and where its links lead
        if named == Path("/") or any(named == tree or named.is_relative_to(tree) for tree in SYSTEM_TREES):
            raise NotWeights(f"{root} is not a model's weights")
    found: list[tuple[int, str, Path]] = []
    if root.is_file():
        found.append((_checked_size(root), str(root), root))
    elif root.is_dir():
        top = root.resolve()
        for file in _walk(root):
            if file.resolve().is_relative_to(top):
                found.append((_checked_size(file), str(file), file))
                if len(found) > MAX_FILES:
                    raise NotWeights(f"{root} holds more than {MAX_FILES} files")
    found.sort(key=lambda item: (-item[0], item[1]))
    return WeightFiles(tuple(f for _, _, f in found), tuple(size for size, _, _ in found))


def _checked_size(file: Path) -> int:
    info = file.stat()
    if info.st_size > 2 * info.st_blocks * 512 + mmap.PAGESIZE:
        raise NotWeights(f"{file} is mostly holes (a sparse file), not weights")
    return info.st_size


def _walk(root: Path) -> Iterator[Path]:
    """The regular files under ``root`` (links to files followed, not links to folders), entry by entry: a folder of
    millions of entries costs ``MAX_ENTRIES`` of them, not a listing of all."""
    seen = 0
    folders = [root]
    while folders:
        with os.scandir(folders.pop()) as entries:
            for entry in entries:
                seen += 1
                if seen > MAX_ENTRIES:
                    raise NotWeights(f"{root} has more than {MAX_ENTRIES} entries")
                if entry.is_dir(follow_symlinks=False):
                    if Path(entry.path) not in SYSTEM_TREES:
                        folders.append(Path(entry.path))
                elif entry.is_file():
                    yield Path(entry.path)


def weight_files(path: str | Path) -> list[Path]:
    """The files of the weights at ``path`` (empty when there is nothing there), largest first."""
    return list(scan(path).files)


def weights_bytes(path: str | Path) -> int:
    return scan(path).total_bytes


class OpenWeights:
    """The weights' files opened read-only (``open_weights``): measuring, reading in and letting go then work on
    these descriptors, with whatever identity the caller has by then. Opening is where the permission check is made:
    the keeper opens as the tenant, then measures as the server (``mincore`` tells a process that may not write a
    file nothing true about it: every page reads as resident)."""

    def __init__(self, weights: WeightFiles) -> None:
        self.weights = weights
        self.fds: list[int] = []
        try:
            for file, size in zip(weights.files, weights.sizes, strict=True):
                self.fds.append(os.open(file, os.O_RDONLY | os.O_CLOEXEC | os.O_NOCTTY | os.O_NONBLOCK))
                opened = os.fstat(self.fds[-1])  # the file scanned, not one put in its place since
                if not stat.S_ISREG(opened.st_mode) or opened.st_size != size:
                    raise NotWeights(f"{file} changed while it was looked at")
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds.clear()

    def __enter__(self) -> OpenWeights:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def open_weights(path: str | Path | WeightFiles) -> OpenWeights:
    """The weights' files opened read-only (``OSError`` when one cannot be): close it, or use it in a ``with``."""
    return OpenWeights(path if isinstance(path, WeightFiles) else scan(path))


def resident_bytes(file: Path, ranges: list[tuple[int, int]] | None = None) -> int:
    """Bytes of ``file`` in the page cache now (0 for an empty or unreadable file), over ``ranges`` (offset,
    length) of it when given, else over all of it; one window of ``WINDOW_BYTES`` mapped at a time."""
    try:
        fd = os.open(file, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return 0
    try:
        return _resident_of(fd, ranges)
    finally:
        os.close(fd)


def _resident_of(fd: int, ranges: list[tuple[int, int]] | None, size: int | None = None) -> int:
    """Bytes of the open file in the page cache, over ``ranges`` or all of it, never past ``size`` (the size it was
    scanned with: a file grown since is not measured further); 0 for a file ``mincore`` says nothing true about."""
    info = os.fstat(fd)
    if not _measurable(info):
        return 0
    size = info.st_size if size is None else min(size, info.st_size)
    spans = ranges if ranges is not None else [(0, size)]
    return sum(_resident_in(fd, offset, min(length, size - offset)) for offset, length in spans if offset < size)


def _measurable(info: os.stat_result, uid: int | None = None, groups: tuple[int, ...] | None = None) -> bool:
    """Whether ``mincore`` answers this process truly about the file: since Linux 5.2 it reports every page of a file
    as resident to a process that neither owns the file nor may write it (root may). Such a file counts as not
    cached: a model is then cold (and read in when kept warm), never warm on a false reading."""
    uid = os.geteuid() if uid is None else uid
    groups = (os.getegid(), *os.getgroups()) if groups is None else groups
    if uid in (0, info.st_uid) or info.st_mode & stat.S_IWOTH:
        return True
    return bool(info.st_mode & stat.S_IWGRP) and info.st_gid in groups


def _resident_in(fd: int, offset: int, length: int) -> int:
    done = 0
    vector = (ctypes.c_ubyte * (WINDOW_BYTES // mmap.PAGESIZE))()
    end = offset + length
    while offset < end:
        span = min(WINDOW_BYTES, end - offset)
        address = _libc.mmap(None, span, mmap.PROT_READ, mmap.MAP_SHARED, fd, offset)
        if address in (None, _MAP_FAILED):
            return done
        try:
            pages = (span + mmap.PAGESIZE - 1) // mmap.PAGESIZE
            if _libc.mincore(address, span, vector) != 0:
                return done
            in_core = bytes(vector)[:pages].translate(_LOW_BIT).count(1)
            done += min(span, in_core * mmap.PAGESIZE)
        finally:
            _libc.munmap(address, span)
        offset += span
    return done


def resident_fraction(path: str | Path | WeightFiles | OpenWeights) -> float:
    """The share of the weights' bytes in the page cache (0 when there are no weights), measured over at most
    ``MAX_MEASURED_BYTES`` (windows spread evenly over the files beyond that)."""
    if not isinstance(path, OpenWeights):
        with open_weights(path) as opened:
            return resident_fraction(opened)
    weights = path.weights
    total = weights.total_bytes
    if total == 0:
        return 0.0
    if total <= MAX_MEASURED_BYTES:
        return sum(_resident_of(fd, None, size) for fd, size in zip(path.fds, weights.sizes, strict=True)) / total
    step = WINDOW_BYTES * -(-total // MAX_MEASURED_BYTES)  # one window measured per step of the weights' bytes
    measured = resident = 0
    start = 0  # the file's first byte in the weights' bytes
    for fd, size in zip(path.fds, weights.sizes, strict=True):
        first = -(-start // step) * step - start  # the first window's offset within this file
        first += -first % mmap.PAGESIZE  # mmap maps from page boundaries only
        ranges = [(at, min(WINDOW_BYTES, size - at)) for at in range(first, size, step)]
        measured += sum(length for _, length in ranges)
        resident += _resident_of(fd, ranges, size)
        start += size
    return resident / measured if measured else 0.0


def prefetch(path: str | Path | WeightFiles | OpenWeights) -> int:
    """Read the weights through once (sequential, large reads, the kernel told so) so that they are in the page
    cache; returns the bytes read."""
    if not isinstance(path, OpenWeights):
        with open_weights(path) as opened:
            return prefetch(opened)
    done = 0
    buffer = memoryview(bytearray(READ_CHUNK))
    for fd, size in zip(path.fds, path.weights.sizes, strict=True):  # no further than scanned: a file grown since
        os.posix_fadvise(fd, 0, size, os.POSIX_FADV_SEQUENTIAL)
        offset = 0
        while offset < size and (count := os.preadv(fd, [buffer[: min(READ_CHUNK, size - offset)]], offset)):
            offset += count
        done += offset
    return done


def drop(path: str | Path | WeightFiles | OpenWeights) -> None:
    """Let the kernel forget the weights' clean pages (another process using them keeps them mapped); a file that
    cannot be opened is left alone."""
    if isinstance(path, OpenWeights):
        for fd in path.fds:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        return
    for file in (path if isinstance(path, WeightFiles) else scan(path)).files:
        try:
            fd = os.open(file, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
