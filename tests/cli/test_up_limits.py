"""``tessera up``'s workload limits: a bad ``--workload-pids-max``, ``--workload-mem-per-gpu`` or ``--log-max-size``
is one line naming the option, exit code 2 (no server starts)."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_checks import assert_one_line_error
from typer.testing import CliRunner

from tessera.cli.main import app

runner = CliRunner()


@pytest.mark.parametrize(
    ("option", "value", "says"),
    [
        ("--workload-pids-max", "-1", "at least 8"),
        ("--workload-pids-max", "4194305", "at most 4194304"),  # pids.max refused it, which left no limit
        ("--workload-mem-per-gpu", "lots", "memory size"),
        ("--log-max-size", "big", "not a size"),
    ],
)
def test_bad_limits_are_one_line_naming_the_option(tmp_path: Path, option: str, value: str, says: str) -> None:
    result = runner.invoke(app, ["up", option, value, "--data-dir", str(tmp_path)])
    assert_one_line_error(result, option, says)
