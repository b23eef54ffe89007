"""``tessera up`` stops cleanly on SIGTERM: uvicorn's graceful shutdown, then the loop and backend cleanup, exit 0
(uvicorn re-raises the signal after its shutdown, which the default handler turned into death by SIGTERM)."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from live_server import LiveServer


@pytest.mark.e2e
def test_sigterm_shuts_the_server_down_with_exit_code_0(tmp_path: Path) -> None:
    server = LiveServer(tmp_path / "data")
    server.start()
    assert server.process is not None
    try:
        server.process.send_signal(signal.SIGTERM)
        assert server.process.wait(timeout=30) == 0, (tmp_path / "data" / "server.log").read_text()[-2000:]
    finally:
        server.stop()
