"""``bench/bench_api_load.py`` runs to its end (issue 25: it crashed reading a pid from the "started" event's text,
which no longer names a process): a short run against a real ``tessera up`` exits 0, with nothing lost or left."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

BENCH = Path(__file__).resolve().parents[2] / "bench" / "bench_api_load.py"


def test_the_submission_benchmark_runs_to_its_end() -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH), "--count", "20", "--concurrency", "4"], capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["lost"] == 0 and result["errors"] == 0 and result["processes_left"] == []
