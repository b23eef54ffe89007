"""Checks shared by the CLI tests."""

from __future__ import annotations

from typer.testing import Result


def assert_one_line_error(result: Result, *fragments: str) -> None:
    """Bad input: exit code 2, one ``error: ...`` line on stderr holding every fragment, no traceback."""
    assert result.exit_code == 2, (result.exit_code, result.output)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    assert "Traceback" not in result.output
