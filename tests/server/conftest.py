"""Fixtures of the control-plane tests (the harness itself is in ``server_harness``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from server_harness import MakeHarness, harness_factory


@pytest.fixture
def make_harness(tmp_path: Path) -> Iterator[MakeHarness]:
    make, clients = harness_factory(tmp_path)
    yield make
    for client in clients:
        client.close()
