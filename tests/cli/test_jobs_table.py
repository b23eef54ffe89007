"""``tessera jobs`` in a narrow terminal or a pipe (80 columns): the id, queue, state and GPU count stay whole (a
user needs the id for ``tessera show``), the name and the reason give way, and under 72 columns the share and time
are left out. Run against a stand-in client: the table is the CLI's own work."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from typer.testing import CliRunner

from tessera.cli import commands
from tessera.cli.main import app


def _row(wid: int, name: str, state: str, reason: str) -> dict[str, Any]:
    placement = [{"node": "local", "gpus": [0]}] if state == "running" else []
    return {
        "id": wid, "name": name, "command": ["python", "x.py"], "queue": "research", "state": state, "gpus": 1,
        "gpu_milli": 250, "gpu_mem_mib": 0, "placement": placement, "reason": reason, "submitted_at": 0.0,
        "started_at": 0.0, "finished_at": None, "array_index": None,
    }  # fmt: skip


ROWS = [
    _row(7, "demo-chat-replica-with-a-long-name", "running", ""),
    _row(1234, "eval", "pending", "no node has a GPU with 60% free (2 GPUs at most 40% free)"),
]


class StandIn:
    def workloads(self, states: Any, queue: Any, array: Any = None) -> list[dict[str, Any]]:
        return ROWS


@contextmanager
def stand_in(url: Any, token: Any) -> Iterator[StandIn]:
    yield StandIn()


@pytest.mark.parametrize("columns", [40, 60, 80, 120])
def test_the_ids_and_states_stay_whole_at_any_width(columns: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(commands, "client_for", stand_in)
    result = CliRunner().invoke(app, ["jobs"], env={"COLUMNS": str(columns)})
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].split()[:2] == ["ID", "NAME"]
    assert lines[1].split()[0] == "7" and lines[2].split()[0] == "1234"
    assert "running" in lines[1] and "pending" in lines[2] and "research" in lines[1]
    assert all(len(line) <= columns for line in lines)
    assert ("TIME" in lines[0]) == (columns >= 72)
    if columns >= 120:
        assert "demo-chat-replica-with-a-lo" in lines[1] and "60% free" in lines[2]
    elif columns >= 60:
        assert "…" in lines[2]  # the reason is cut with an ellipsis, not wrapped onto a second line
    assert len(lines) == 3
