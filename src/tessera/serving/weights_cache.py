"""A model's weights in the host's page cache: how much of them is there, reading them in, letting them go.

This is the live warm tier on a host whose engines restart from files (on the CPU, or any engine without a sleep
mode): a replica started while its weights are in the page cache skips the disk. ``resident_fraction`` asks the
kernel (``mincore`` over a read-only mapping of each file, no page touched); ``prefetch`` reads the files through
once, sequentially, so that they are; ``drop`` tells the kernel it may forget them (``POSIX_FADV_DONTNEED``: clean
pages go at once, pages still being written back stay). The weights are a file or every regular file under a
folder (``.safetensors``, ``.bin``, ``.gguf``, the tokenizer and config files), symlinks followed, never leaving
that folder's tree through a link.
"""

from __future__ import annotations

import ctypes
import mmap
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np

READ_CHUNK = 8 << 20

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
_MAP_FAILED = ctypes.c_void_p(-1).value


def weight_files(path: str | Path) -> list[Path]:
    """The files of the weights at ``path`` (empty when there is nothing there), largest first."""
    root = Path(path)
    if root.is_file():
        return [root]
    if not root.is_dir():
        return []
    top = root.resolve()
    files = [f for f in _walk(root) if f.resolve().is_relative_to(top)]
    return sorted(files, key=lambda f: (-f.stat().st_size, str(f)))


def _walk(root: Path) -> Iterator[Path]:
    for folder, _, names in os.walk(root, followlinks=False):
        for name in names:
            candidate = Path(folder) / name
            if candidate.is_file():
                yield candidate


def weights_bytes(path: str | Path) -> int:
    return sum(f.stat().st_size for f in weight_files(path))


def resident_bytes(file: Path) -> int:
    """Bytes of ``file`` in the page cache now (0 for an empty or unreadable file)."""
    try:
        fd = os.open(file, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return 0
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            return 0
        address = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if address in (None, _MAP_FAILED):
            return 0
        try:
            pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
            vector = (ctypes.c_ubyte * pages)()
            if _libc.mincore(address, size, vector) != 0:
                return 0
            in_core = int(np.count_nonzero(np.frombuffer(bytes(vector), dtype=np.uint8) & 1))  # the low bit: resident
            return min(size, in_core * mmap.PAGESIZE)
        finally:
            _libc.munmap(address, size)
    finally:
        os.close(fd)


def resident_fraction(path: str | Path) -> float:
    """The share of the weights' bytes in the page cache (0 when there are no weights)."""
    files = weight_files(path)
    total = sum(f.stat().st_size for f in files)
    if total == 0:
        return 0.0
    return sum(resident_bytes(f) for f in files) / total


def prefetch(path: str | Path) -> int:
    """Read the weights through once (sequential, large reads, the kernel told so) so that they are in the page
    cache; returns the bytes read."""
    done = 0
    buffer = bytearray(READ_CHUNK)
    for file in weight_files(path):
        with open(file, "rb", buffering=0) as handle:
            os.posix_fadvise(handle.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)
            while count := handle.readinto(buffer):
                done += count
    return done


def drop(path: str | Path) -> None:
    """Let the kernel forget the weights' clean pages (another process using them keeps them mapped)."""
    for file in weight_files(path):
        try:
            fd = os.open(file, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
