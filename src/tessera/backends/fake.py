"""An in-memory ``Backend`` for unit tests of the server loop: no process is started.

``launch`` records the spec and hands out a ``Handle`` of kind ``"fake"`` with a made-up ``pid``; a test ends a workload
with ``finish`` (or ``stop``, which ends it with -15 as if it honoured SIGTERM) and the next ``poll`` reports it, once.
Like the local backend, ``find`` knows a launched workload's handle from the moment ``launch`` is called until the
server ``forget``s it (after it stored the end), also after ``close`` (so one instance can play a restarted server's
backend too, and a crash anywhere after the launch began leaves the workload findable, as the local backend's launch
intent does); a reported end that was not forgotten is reported again after an ``adopt``, as the local backend's exit
file is read again. ``pids`` answers the made-up
pid while the workload runs (so the memory watchdog can be tested against a fake NVML that reports it). With
``node_ports`` it gives a ``LaunchSpec.node_port`` workload a made-up port on its node's address, as Ray's does.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from tessera.backends.base import (
    LISTEN_HOST_ENV,
    LISTEN_PORT_ENV,
    Backend,
    BackendNode,
    ExitStatus,
    Handle,
    JsonScalar,
    LaunchSpec,
)
from tessera.core.errors import InvalidRequestError

FIRST_FAKE_PID = 100_000
FIRST_FAKE_PORT = 20_000
STOPPED_EXIT_CODE = -15  # what a workload that honours SIGTERM reports
KIND = "fake"


def fake_pid(handle: Handle) -> int:
    """The made-up pid of a fake handle."""
    pid = handle.data.get("pid")
    if handle.backend != KIND or not isinstance(pid, int):
        raise InvalidRequestError("handle", f"{handle.workload_id}: not a fake backend's handle")
    return pid


class FakeBackend:
    """``Backend`` double; ``launched``, ``adopted`` and ``stops`` record every call, in order."""

    kind = KIND

    def __init__(
        self, nodes: Sequence[BackendNode] = (BackendNode("local", "localhost"),), *, node_ports: bool = False
    ) -> None:
        """``node_ports``: honour ``LaunchSpec.node_port`` as the Ray backend does (a made-up port on the node's
        address, from ``FIRST_FAKE_PORT`` on, in the workload's environment and ``listen_address``)."""
        self._nodes = list(nodes)
        self._node_ports = node_ports
        self._next_port = FIRST_FAKE_PORT
        self.launched: list[LaunchSpec] = []
        self.adopted: list[Handle] = []
        self.stops: list[tuple[str, float]] = []  # (workload id, grace_s) per stop call
        self.closed = False
        self._lock = threading.Lock()
        self._running: dict[str, Handle] = {}
        self._ended: dict[str, int | None] = {}  # ended, to be reported by the next poll (insertion order)
        self._findable: dict[str, Handle] = {}  # launched, not forgotten yet
        self._reported: dict[str, int | None] = {}  # ended and reported, not forgotten yet: reported again if adopted
        self._ended_unwatched: dict[str, int | None] = {}  # ended while no server watched: reported once adopted
        self._next_pid = FIRST_FAKE_PID

    def nodes(self) -> list[BackendNode]:
        return list(self._nodes)

    def launch(self, spec: LaunchSpec) -> Handle:
        with self._lock:
            if spec.workload_id in self._running:
                raise InvalidRequestError("workload_id", f"{spec.workload_id!r} is already running")
            pid, self._next_pid = self._next_pid, self._next_pid + 1
            data: dict[str, JsonScalar] = {"pid": pid}
            if self._node_ports and spec.node_port:
                host = next((n.address for n in self._nodes if n.name == spec.node), self._nodes[0].address)
                data |= {"listen_host": host, "listen_port": self._next_port}
                self._next_port += 1
                spec = replace(spec, env={**spec.env, LISTEN_HOST_ENV: host, LISTEN_PORT_ENV: str(data["listen_port"])})
            ref = Handle(spec.workload_id, KIND, data)
            self.launched.append(spec)
            self._running[spec.workload_id] = ref
            self._findable[spec.workload_id] = ref
            self._reported.pop(spec.workload_id, None)
            return ref

    def find(self, workload_id: str) -> Handle | None:
        with self._lock:
            return self._findable.get(workload_id)

    def runtime_dir(self, workload_id: str) -> Path | None:
        return None  # nothing runs: no directory to give

    def private_network(self) -> bool:
        return False

    def node_ports(self) -> bool:
        return self._node_ports

    def listen_address(self, handle: Handle) -> tuple[str, int] | None:
        host, port = handle.data.get("listen_host"), handle.data.get("listen_port")
        if not isinstance(host, str) or not isinstance(port, int) or not self.pids(handle):
            return None
        return host, port

    def pids(self, handle: Handle) -> list[int]:
        pid = fake_pid(handle)
        with self._lock:
            running = handle.workload_id in self._running and handle.workload_id not in self._ended
        return [pid] if running else []

    def adopt(self, ref: Handle) -> None:
        fake_pid(ref)
        with self._lock:
            self.adopted.append(ref)
            self._running.setdefault(ref.workload_id, ref)
            if ref.workload_id in self._ended_unwatched:
                self._ended.setdefault(ref.workload_id, self._ended_unwatched.pop(ref.workload_id))
            elif ref.workload_id in self._reported:
                self._ended.setdefault(ref.workload_id, self._reported[ref.workload_id])

    def finish(self, workload_id: str, exit_code: int | None) -> None:
        """Ends a workload with ``exit_code`` (None: vanished): a tracked one is reported by the next ``poll``, one
        launched but no longer tracked (after ``close``: the server died) by the ``poll`` after its ``adopt``."""
        with self._lock:
            if workload_id in self._running:
                self._ended.setdefault(workload_id, exit_code)
            elif workload_id in self._findable:
                self._ended_unwatched.setdefault(workload_id, exit_code)
            else:
                raise KeyError(f"{workload_id!r} was not launched by this FakeBackend")

    def stop(self, workload_id: str, grace_s: float) -> None:
        with self._lock:
            self.stops.append((workload_id, grace_s))
            if workload_id in self._running:
                self._ended.setdefault(workload_id, STOPPED_EXIT_CODE)

    def poll(self) -> list[ExitStatus]:
        with self._lock:
            ended = [ExitStatus(workload_id, code) for workload_id, code in self._ended.items()]
            for workload_id, code in self._ended.items():
                del self._running[workload_id]
                self._reported[workload_id] = code
            self._ended.clear()
            return ended

    def forget(self, workload_id: str) -> None:
        with self._lock:
            if workload_id not in self._running:
                self._findable.pop(workload_id, None)
                self._reported.pop(workload_id, None)

    def tracked(self) -> set[str]:
        with self._lock:
            return set(self._running)

    def close(self) -> None:
        with self._lock:
            self.closed = True
            self._running.clear()
            self._ended.clear()


if TYPE_CHECKING:  # mypy checks that the class satisfies the seam

    def _as_backend(backend: FakeBackend) -> Backend:
        return backend
