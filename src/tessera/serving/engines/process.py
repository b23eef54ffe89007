"""``LocalProcess``: the ``ProcessRunner`` that runs an engine as a child process of this one.

For tests, benchmarks and a one-machine ``make run``; the serving controller launches replicas through the backend
instead. The child gets its own process group, so that stopping it stops what it started too.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket

from tessera.serving.engines.base import EngineCommand, EngineError


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` now (another process may take it before it is used: retry on failure)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


class LocalProcess:
    """One engine process (see the module docstring)."""

    def __init__(self, log_path: str | None = None) -> None:
        self._log_path = log_path  # stdout and stderr go there (else to /dev/null)
        self._process: asyncio.subprocess.Process | None = None

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    async def launch(self, command: EngineCommand) -> None:
        if self._process is not None:
            raise EngineError(f"already launched (pid {self._process.pid})")
        env = {**os.environ, **command.env}
        with open(self._log_path or os.devnull, "ab") as log:
            self._process = await asyncio.create_subprocess_exec(
                *command.argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                env=env,
                cwd=command.cwd,
                start_new_session=True,
            )

    def exit_code(self) -> int | None:
        return self._process.returncode if self._process is not None else None

    async def terminate(self, grace_s: float) -> None:
        """SIGTERM to its process group, SIGKILL after ``grace_s``; returns once it has ended."""
        process = self._process
        if process is None or process.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(process.wait(), grace_s)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            await process.wait()
