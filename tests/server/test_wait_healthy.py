"""wait_healthy: scripts and tests wait for a freshly started server through it."""

from pathlib import Path

import pytest
from live_server import LiveServer, free_port

from tessera.client.http import wait_healthy


def test_it_gives_up_when_the_process_exits_or_time_runs_out() -> None:
    nothing_there = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(RuntimeError, match="exited with 3"):
        wait_healthy(nothing_there, timeout_s=5.0, exit_code=lambda: 3)
    with pytest.raises(TimeoutError, match="not ready"):
        wait_healthy(nothing_there, timeout_s=0.3)


@pytest.mark.e2e
def test_it_returns_once_a_real_server_answers(tmp_path: Path) -> None:
    server = LiveServer(tmp_path)
    server.start()  # waits through wait_healthy
    try:
        wait_healthy(server.url, timeout_s=1.0)
        assert server.client().health()
    finally:
        server.stop()
