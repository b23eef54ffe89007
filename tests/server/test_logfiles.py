"""Workload logs as the API reads them (``server/logfiles.py``): chunks end on whole UTF-8 characters whatever the
chunk size, ``--tail`` finds the last lines, also across a rotation, and offsets keep counting every byte. (The cap
and the rotation themselves: tests/backends/test_capped_log.py.)"""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from tessera.backends.capped_log import CappedLog, Segments, rotated_path
from tessera.errors import InvalidRequestError
from tessera.server.logfiles import LogFiles, _tail_offset, complete_utf8, parse_size_bytes

TEXT = "aé€😀\n" * 50 + "last line without newline é"


def files(tmp_path: Path) -> LogFiles:
    return LogFiles(lambda wid: tmp_path / f"{wid}.log")


def read_all(logs: LogFiles, wid: int, limit: int, finished: bool = True, offset: int = 0) -> tuple[bytes, int]:
    out = b""
    while True:
        got = logs.read(wid, offset, limit, finished)
        if got.next_offset == offset:
            return out, offset
        out += got.data
        offset = got.next_offset


def test_complete_utf8_holds_back_only_an_unfinished_character() -> None:
    euro = "€".encode()  # 3 bytes
    assert complete_utf8(b"ab" + euro) == 5
    assert complete_utf8(b"ab" + euro[:1]) == 2
    assert complete_utf8(b"ab" + euro[:2]) == 2
    assert complete_utf8("😀".encode()[:3]) == 0
    assert complete_utf8(b"\x80\x80") == 2  # stray continuation bytes are not waited for


@pytest.mark.parametrize("limit", [1, 2, 3, 5, 7, 64])
def test_every_chunk_decodes_to_whole_characters(tmp_path: Path, limit: int) -> None:
    """The old route decoded each raw chunk with errors="replace": a character cut by the chunk size became two
    replacement characters. Now each chunk is valid UTF-8 and the chunks put together are the file."""
    (tmp_path / "1.log").write_bytes(TEXT.encode())
    logs = files(tmp_path)
    offset, text = 0, ""
    while True:
        got = logs.read(1, offset, limit, finished=True)  # 4 bytes at least: one character fits
        if got.next_offset == offset:
            break
        text += got.data.decode("utf-8")  # strict: raises on a cut character
        offset = got.next_offset
    assert text == TEXT


def test_a_running_workload_s_half_written_character_waits_and_a_finished_log_s_last_byte_comes(
    tmp_path: Path,
) -> None:
    path = tmp_path / "1.log"
    path.write_bytes(b"ok " + "€".encode()[:2])
    logs = files(tmp_path)
    got = logs.read(1, 0, 100, finished=False)
    assert got.data == b"ok " and got.next_offset == 3
    assert logs.read(1, 3, 100, finished=False).data == b""  # still waiting for the last byte
    assert logs.read(1, 3, 100, finished=True).data == "€".encode()[:2]  # ended: no more will come


@pytest.mark.parametrize(
    ("content", "lines", "expected"),
    [
        (b"a\nb\nc\n", 2, b"b\nc\n"),
        (b"a\nb\nc", 2, b"b\nc"),
        (b"a\nb\nc\n", 10, b"a\nb\nc\n"),
        (b"a\nb\nc\n", 0, b""),
        (b"", 3, b""),
    ],
)
def test_tail_offset_starts_at_the_last_lines(tmp_path: Path, content: bytes, lines: int, expected: bytes) -> None:
    (tmp_path / "1.log").write_bytes(content)
    logs = files(tmp_path)
    start = logs.tail_offset(1, lines)
    assert read_all(logs, 1, 100, offset=start)[0] == expected


def test_tail_across_a_long_log(tmp_path: Path) -> None:
    lines = [f"line {i} é\n".encode() for i in range(30_000)]  # several of the tail's 64 KiB blocks
    (tmp_path / "1.log").write_bytes(b"".join(lines))
    logs = files(tmp_path)
    assert read_all(logs, 1, 1 << 20, offset=logs.tail_offset(1, 12_345))[0] == b"".join(lines[-12_345:])


class _CountingReader(io.BufferedReader):
    """A file that counts the bytes read from it."""

    def __init__(self, path: Path) -> None:
        super().__init__(io.FileIO(path, "rb"))
        self.bytes_read = 0

    def read(self, size: int | None = -1) -> bytes:
        data = super().read(size)
        self.bytes_read += len(data)
        return data


def test_a_tail_reaching_into_the_rotated_file_reads_the_current_one_once(tmp_path: Path) -> None:
    """The current file was scanned for the tail, then read whole again to count its lines."""
    lines = [f"line {i}\n".encode() for i in range(40_000)]  # several of the tail's 64 KiB blocks per file
    (tmp_path / "1.log.1").write_bytes(b"".join(lines[:20_000]))
    (tmp_path / "1.log").write_bytes(b"".join(lines[20_000:]))
    with _CountingReader(tmp_path / "1.log.1") as rotated, _CountingReader(tmp_path / "1.log") as current:
        size = len(b"".join(lines[:20_000]))
        offset = _tail_offset(Segments(rotated, 0, current, size), 30_000)
        assert offset == len(b"".join(lines[:10_000]))
        assert current.bytes_read == (tmp_path / "1.log").stat().st_size


def test_reads_and_tail_span_the_rotated_file_and_the_current_one(tmp_path: Path) -> None:
    path = tmp_path / "7.log"
    writer = CappedLog(path, max_bytes=1000)
    written = b""
    for round_ in range(10):
        chunk = f"{round_:02d}".encode() * 300 + b"\n"  # 601 bytes a round: a rotation before each write
        writer.write(chunk)
        written += chunk
    writer.close()
    logs = files(tmp_path)
    kept, end = read_all(logs, 7, 256)  # from 0: starts at the oldest byte kept, the rotated file's first
    assert end == len(written) and kept == written[-2 * 601 :] and rotated_path(path).stat().st_size == 601
    assert logs.read(7, 0, 10, finished=True).offset == len(written) - len(kept)
    assert read_all(logs, 7, 100, offset=logs.tail_offset(7, 1))[0] == written[-601:]
    assert read_all(logs, 7, 100, offset=logs.tail_offset(7, 2))[0] == kept  # the second line is in the rotated one
    assert read_all(logs, 7, 100, offset=logs.tail_offset(7, 50))[0] == kept  # no more is kept


def test_a_rotated_file_that_ends_inside_a_character_is_read_to_its_end(tmp_path: Path) -> None:
    """A writer that does not hold characters back (the Ray backend appends what it is sent) can leave a rotated
    file ending inside one: its last bytes come (with a replacement character), a follower never waits there."""
    path = tmp_path / "1.log"
    rotated_path(path).write_bytes(b"ab" + "€".encode()[:1])
    path.write_bytes("€".encode()[1:] + b"cd")
    (tmp_path / "1.log.base").write_text(f"3 {path.stat().st_ino}\n")
    logs = files(tmp_path)
    got, end = read_all(logs, 1, 100, finished=False)  # stops only when a read brings nothing
    assert got == b"ab" + "€".encode() + b"cd" and end == 3 + len(path.read_bytes())


def test_sizes_of_the_log_cap() -> None:
    assert parse_size_bytes("64MiB", "--log-max-size") == 64 * 1024 * 1024
    assert parse_size_bytes("1G", "--log-max-size") == 1_000_000_000
    assert parse_size_bytes("0", "--log-max-size") == 0
    with pytest.raises(InvalidRequestError, match="--log-max-size"):
        parse_size_bytes("lots", "--log-max-size")


def test_a_ranks_log_is_read_apart_and_counts_as_there_once_rotated(tmp_path: Path) -> None:
    logs = files(tmp_path)
    (tmp_path / "7.log").write_bytes(b"rank zero\n")
    writer = CappedLog(tmp_path / "7.log.rank2", max_bytes=8)
    writer.write(b"first\n")
    writer.write(b"second\n")  # rotates: "first" goes to 7.log.rank2.1
    writer.close()
    assert logs.path(7, 2) == tmp_path / "7.log.rank2" and logs.path(7) == tmp_path / "7.log"
    assert read_all(logs, 7, 4) == (b"rank zero\n", 10)
    assert logs.read(7, 0, 100, True, rank=2).data == b"first\n"
    assert logs.read(7, 6, 100, True, rank=2).data == b"second\n"
    assert logs.tail_offset(7, 1, rank=2) == 6
    (tmp_path / "7.log.rank2").unlink()
    assert logs.has_rank(7, 2) and logs.has_rank(7, 0) and not logs.has_rank(7, 1) and logs.has_rank(8, 0)
