"""Reading the text files a user hands Tessera (the CLI's ``submit -f``, ``queues apply -f``, config and admin token
files; the simulator's traces and tables): UTF-8 (a leading BOM dropped); a file that is not UTF-8 is one
``InputFileError`` naming the file and the line of the first bad byte, never a ``UnicodeDecodeError`` traceback.
Imports nothing heavy: the CLI loads it at start."""

from __future__ import annotations

from pathlib import Path

from tessera.errors import InputFileError


def read_text_file(path: Path) -> str:
    """``path``'s text. ``OSError`` (missing, unreadable) is left to the caller; bytes that are not UTF-8 raise
    ``InputFileError(path, line, None, "not UTF-8 text ...")``."""
    data = path.read_bytes()
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        bad = data[exc.start : exc.start + 1].hex()
        raise InputFileError(str(path), line, None, f"not UTF-8 text (byte 0x{bad} at offset {exc.start})") from None
