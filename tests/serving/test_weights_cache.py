"""The page-cache operations behind the live warm tier, on real files: the kernel's answer (``mincore``) moves as
the weights are dropped and read in again."""

from __future__ import annotations

import os
import stat
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


def test_reading_in_and_measuring_stop_at_the_sizes_scanned(tmp_path: Path) -> None:
    """A tenant's file grown after the scan (``truncate -s 16T``) once had the keeper read every byte of it."""
    folder = write_weights(tmp_path / "m", {"model.safetensors": 1 << 20})
    with weights_cache.open_weights(folder) as opened:
        with open(folder / "model.safetensors", "r+b") as handle:
            handle.truncate(8 << 30)  # 8 GiB of holes after the scan
        assert weights_cache.prefetch(opened) == 1 << 20
        assert weights_cache.resident_fraction(opened) <= 1.0


def test_a_link_into_a_system_tree_is_not_weights(tmp_path: Path) -> None:
    (tmp_path / "cpus").symlink_to("/sys/devices/system/cpu")
    (tmp_path / "all").symlink_to("/")
    for link in ("cpus", "all"):
        with pytest.raises(weights_cache.NotWeights, match="not a model's weights"):
            weights_cache.scan(tmp_path / link)


def test_sampled_windows_start_on_page_boundaries_in_every_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past the measured cap, windows are spread over the files; one starting inside a page could not be mapped
    and counted as not cached, so fully cached weights of odd sizes measured 0.6."""
    folder = write_weights(tmp_path / "m", {"a.safetensors": (3 << 20) + 1234, "b.safetensors": (3 << 20) + 777})
    weights_cache.prefetch(folder)
    monkeypatch.setattr(weights_cache, "WINDOW_BYTES", 256 * 1024)
    monkeypatch.setattr(weights_cache, "MAX_MEASURED_BYTES", 1 << 20)
    assert weights_cache.resident_fraction(folder) > 0.95


def test_a_file_mincore_says_nothing_true_about_counts_as_not_cached() -> None:
    """Since Linux 5.2 ``mincore`` reports every page resident to a process that neither owns a file nor may write
    it: measured as ``nobody``, an uncached root-owned 0644 file read 1.0, so a non-root server showed such weights
    warm. Only the owner, a writer or root is believed."""

    def stat_of(mode: int, uid: int, gid: int) -> os.stat_result:
        return os.stat_result((stat.S_IFREG | mode, 1, 1, 1, uid, gid, 4096, 0, 0, 0))

    shared = stat_of(0o644, uid=0, gid=0)
    assert not weights_cache._measurable(shared, uid=1000, groups=(1000,))
    assert weights_cache._measurable(shared, uid=0, groups=(0,))  # root
    assert weights_cache._measurable(stat_of(0o600, uid=1000, gid=1000), uid=1000, groups=(1000,))  # the owner
    assert weights_cache._measurable(stat_of(0o664, uid=0, gid=50), uid=1000, groups=(1000, 50))  # a writer
