"""Issue 25, defect 3, through a real ``tessera up`` (``bench/gateway_fd_cycles.py``, scaled down): models deployed,
streamed to and deleted again and again leave the server's descriptor count where it was. Before, every stream left a
pooled connection to a replica that had gone (CLOSE_WAIT): 200 descriptors more per cycle of 200 streams."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

BENCH = Path(__file__).resolve().parents[2] / "bench"


def test_deploy_stream_delete_cycles_leave_no_descriptors_behind() -> None:
    done = subprocess.run(
        [sys.executable, "gateway_fd_cycles.py", "--cycles", "3", "--streams", "150", "--slack", "30"],
        cwd=BENCH, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["errors"] == 0 and result["fds_after"] <= result["fds_before"] + 30, result
