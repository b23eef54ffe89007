"""The log cap where the bytes are written (``backends/capped_log.py``): a file never passes the cap (a log takes at
most twice the cap on disk), rotation is a rename that a reader never waits for and never misreads, also halfway
through (a writer killed between its rename and its base), and no file ends inside a UTF-8 character."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tessera.backends.capped_log import (
    CappedLog,
    base_path,
    logical_size,
    open_segments,
    read_base,
    rotated_path,
    write_base,
)
from tessera.server.logfiles import LogFiles


def _all_kept(path: Path) -> tuple[int, bytes]:
    """(logical offset of the oldest byte kept, every byte kept in order)."""
    with open_segments(path) as segments:
        rotated = b"" if segments.rotated is None else segments.rotated.read()
        current = b"" if segments.current is None else segments.current.read()
        assert segments.current_start == segments.rotated_start + len(rotated)
        return segments.rotated_start, rotated + current


def test_a_file_never_passes_the_cap_and_offsets_count_every_byte(tmp_path: Path) -> None:
    path = tmp_path / "1.log"
    log = CappedLog(path, max_bytes=1000)
    written = b""
    for round_ in range(50):
        chunk = f"{round_:02d}".encode() * 170  # 340 bytes
        log.write(chunk)
        written += chunk
        assert path.stat().st_size <= 1000
        assert path.stat().st_size + _size(rotated_path(path)) <= 2000
    log.close()
    oldest, kept = _all_kept(path)
    assert oldest + len(kept) == len(written) == logical_size(path)
    assert written.endswith(kept) and len(kept) > 1000  # the current file and the one before it
    assert read_base(path) == (oldest + _size(rotated_path(path)), path.stat().st_ino)


def test_a_follower_misses_nothing_across_rotations(tmp_path: Path) -> None:
    """The old server copied the file and truncated it, under a lock that every reader waited for; now the writer
    renames, and a follower reading between writes sees every byte once, in order."""
    path = tmp_path / "7.log"
    logs = LogFiles(lambda wid: tmp_path / f"{wid}.log")
    log = CappedLog(path, max_bytes=1000)
    written, seen, offset = b"", b"", 0
    for round_ in range(30):
        chunk = f"{round_:02d}".encode() * 300
        log.write(chunk)
        written += chunk
        got = logs.read(7, offset, 1 << 20, finished=False)
        assert got.offset == offset
        seen, offset = seen + got.data, got.next_offset
        if got.next_offset < len(written):  # the rest of the rotated file came first: the current file next
            got = logs.read(7, offset, 1 << 20, finished=False)
            seen, offset = seen + got.data, got.next_offset
    log.close()
    assert seen == written
    assert logs.read(7, 0, 10, finished=True).offset == len(written) - len(_all_kept(path)[1])


def test_a_write_larger_than_the_cap_gets_a_file_of_its_own(tmp_path: Path) -> None:
    path = tmp_path / "1.log"
    log = CappedLog(path, max_bytes=100)
    log.write(b"a" * 10)
    log.write(b"b" * 500)
    log.write(b"c" * 10)
    log.close()
    assert rotated_path(path).read_bytes() == b"b" * 500 and path.read_bytes() == b"c" * 10


def test_no_cap_never_rotates(tmp_path: Path) -> None:
    path = tmp_path / "1.log"
    log = CappedLog(path, max_bytes=0)
    for _ in range(10):
        log.write(b"x" * 1000)
    log.close()
    assert path.stat().st_size == 10_000 and not rotated_path(path).exists() and not base_path(path).exists()


def test_no_file_ends_inside_a_character(tmp_path: Path) -> None:
    path = tmp_path / "1.log"
    log = CappedLog(path, max_bytes=8)
    euro = "€".encode()  # 3 bytes
    log.write(b"abcdef" + euro[:1])  # the character's first byte is held back ...
    assert path.read_bytes() == b"abcdef"
    log.write(euro[1:] + b"gh")  # ... and goes with the rest of it, into the next file
    log.close()
    assert rotated_path(path).read_bytes() == b"abcdef" and path.read_bytes() == euro + b"gh"


def test_a_log_ending_inside_a_character_keeps_its_last_bytes(tmp_path: Path) -> None:
    path = tmp_path / "1.log"
    log = CappedLog(path, max_bytes=0)
    log.write(b"ok " + "€".encode()[:2])
    log.close()  # the output ended there: the bytes are written, not lost
    assert path.read_bytes() == b"ok " + "€".encode()[:2]


@pytest.mark.parametrize("new_file", [False, True])
def test_a_reader_and_a_new_writer_see_through_a_rotation_cut_short(tmp_path: Path, new_file: bool) -> None:
    """A writer killed between its rename and its base (the new current file made or not): ``.1`` is the file the
    base names, so it starts at that base, and the current file after it."""
    path = tmp_path / "1.log"
    path.write_bytes(b"old")
    write_base(path, 100, path.stat().st_ino)
    rotated_before = rotated_path(path)
    rotated_before.write_bytes(b"older")
    os.replace(path, rotated_path(path))  # the rename of a rotation; the base still says 100 for that file
    if new_file:
        path.write_bytes(b"new")
    with open_segments(path) as segments:
        assert (segments.rotated_start, segments.current_start) == (100, 103)
    logs = LogFiles(lambda wid: tmp_path / f"{wid}.log")
    assert logs.read(1, 0, 100, finished=True).data == b"old"  # from the oldest byte kept
    assert logs.read(1, 103, 100, finished=True).data == (b"new" if new_file else b"")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)  # the next run of the workload
    log = CappedLog(path, max_bytes=1000, fd=fd)
    assert log.base == 103 and read_base(path) == (103, os.fstat(fd).st_ino)
    log.close()


class _Killed(Exception):
    pass


class _KilledAfterItsRename(CappedLog):
    """A writer killed between a rotation's rename (and new file) and its new base."""

    def _record_base(self) -> None:
        if rotated_path(self.path).exists():
            raise _Killed
        super()._record_base()


def test_the_first_rotation_of_a_log_without_a_base_file_cut_short(tmp_path: Path) -> None:
    """A log never rotated has no base file: its first rotation recorded no inode, so between the rename and the
    base (for good, when the writer was killed there) readers took ``.1`` for the file before it, at -3, and the
    rotated bytes were lost to them. Its base is now recorded before the rename."""
    path = tmp_path / "1.log"
    log = _KilledAfterItsRename(path, max_bytes=10)
    assert not base_path(path).exists()  # nothing to record for an empty log
    log.write(b"old")
    with pytest.raises(_Killed):
        log.write(b"new bytes")  # 3 + 9 > 10: a rotation
    assert rotated_path(path).read_bytes() == b"old" and path.read_bytes() == b""
    with open_segments(path) as segments:
        assert (segments.rotated_start, segments.current_start) == (0, 3)
    logs = LogFiles(lambda wid: tmp_path / f"{wid}.log")
    assert logs.read(1, 0, 100, finished=True).data == b"old"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)  # the next run of the workload
    next_log = CappedLog(path, max_bytes=1000, fd=fd)
    assert next_log.base == 3 and read_base(path) == (3, os.fstat(fd).st_ino)
    next_log.close()


def test_an_old_base_file_without_an_inode_is_read(tmp_path: Path) -> None:
    path = tmp_path / "1.log"
    path.write_bytes(b"abc")
    base_path(path).write_text("40\n")  # as the copy-and-truncate rotation wrote it
    with open_segments(path) as segments:
        assert segments.current_start == 40
    assert logical_size(path) == 43


def _size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0
