"""Fixtures of the control-plane tests (the harness itself is in ``server_harness``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from server_harness import MakeHarness, harness_factory

from tessera import faults


@pytest.fixture
def make_harness(tmp_path: Path) -> Iterator[MakeHarness]:
    make, clients = harness_factory(tmp_path)
    yield make
    for client in clients:
        client.close()


@pytest.fixture
def fail_at(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """``fail_at("point:N")`` arms ``TESSERA_FAIL_AT`` for this test (read again at the next fault point)."""

    def arm(plan: str) -> None:
        monkeypatch.setenv(faults.FAIL_ENV, plan)
        faults.reset()

    faults.reset()
    yield arm
    monkeypatch.delenv(faults.FAIL_ENV, raising=False)
    faults.reset()
