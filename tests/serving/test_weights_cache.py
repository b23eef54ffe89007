"""The page-cache operations behind the live warm tier, on real files: the kernel's answer (``mincore``) moves as
the weights are dropped and read in again."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tessera.serving import weights_cache


def write_weights(folder: Path, sizes: dict[str, int]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, size in sizes.items():
        with open(folder / name, "wb") as handle:
            handle.write(os.urandom(size))
            handle.flush()
            os.fsync(handle.fileno())  # clean pages: only those can be dropped
    return folder


def test_dropped_weights_leave_the_page_cache_and_a_prefetch_brings_them_back(tmp_path: Path) -> None:
    folder = write_weights(tmp_path / "m", {"model.safetensors": 8 << 20, "config.json": 4096})
    weights_cache.prefetch(folder)
    assert weights_cache.resident_fraction(folder) > 0.99
    weights_cache.drop(folder)
    if weights_cache.resident_fraction(folder) > 0.5:
        pytest.skip("this filesystem keeps the pages despite POSIX_FADV_DONTNEED")
    assert weights_cache.resident_fraction(folder) < 0.1
    assert weights_cache.prefetch(folder) == (8 << 20) + 4096
    assert weights_cache.resident_fraction(folder) > 0.99


def test_the_weights_are_the_files_of_the_folder_largest_first_and_never_outside_it(tmp_path: Path) -> None:
    folder = write_weights(tmp_path / "m", {"a.bin": 100, "b.safetensors": 3000})
    outside = write_weights(tmp_path / "elsewhere", {"secret": 5000})
    (folder / "link").symlink_to(outside / "secret")
    assert [f.name for f in weights_cache.weight_files(folder)] == ["b.safetensors", "a.bin"]
    assert weights_cache.weights_bytes(folder) == 3100
    assert weights_cache.weight_files(tmp_path / "missing") == []
    assert weights_cache.resident_fraction(tmp_path / "missing") == 0.0
    single = folder / "a.bin"
    assert weights_cache.weight_files(single) == [single]
