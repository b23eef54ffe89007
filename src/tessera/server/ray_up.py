"""``tessera up --backend ray``: the Ray backend and the GPU pool read from the Ray cluster.

With ``--ray-address`` the server joins that cluster; without, it starts (or finds again) a single-host one on
127.0.0.1 whose GPUs are those of ``--gpus`` (``backends.ray.local_cluster``) and says so. The pool is the cluster's
GPU nodes (each Ray node one Tessera node, CPUs and memory as Ray reports them): read at start, then polled by a
``NodeWatch`` thread every ``NODES_POLL_S`` (one ``ray.nodes()`` call, off the scheduler's thread) whose news the
loop takes at its next tick (``server.node_sync``: nodes that join get work, nodes that leave are drained).
Imports Ray only through ``tessera.backends.ray``, and only when called: a server without the ``ray`` extra runs the
local backend as before.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tessera.backends.base import Backend
from tessera.core.catalog import resolve_model
from tessera.core.cluster import NodeSpec
from tessera.errors import InvalidRequestError, TesseraError
from tessera.gpu.discovery import AUTO_SPEC, DEFAULT_SIMULATED_SPEC
from tessera.gpu.gpus import SIMULATED_UUID_PREFIX, GpuDevice, SimulatedProbe, parse_gpu_spec
from tessera.server.node_sync import PoolNode
from tessera.server.pool import Pool

if TYPE_CHECKING:
    from tessera.backends.ray.backend import RayBackend
    from tessera.backends.ray.nodes import RayNode

log = logging.getLogger(__name__)

NODES_WAIT_S = 60.0  # how long a just-started local head may take to register its node
NODES_POLL_S = 2.0  # how often the cluster's node list is read (one ray.nodes() call, on the watch thread)


@dataclass(frozen=True, slots=True)
class RaySetup:
    backend: Backend
    pool: Pool
    probe: SimulatedProbe  # the cluster's GPUs (no NVML on this host: usage is not read through Ray)
    notice: str  # one line for the operator: which cluster, started here or joined
    watch: NodeWatch  # the loop's node feed (``latest``); started by ``build_server``'s caller, ``stop`` at the end


def connect(address: str | None, gpus: str, data_dir: Path) -> RaySetup:
    """Joins the Ray cluster at ``address`` (or starts a local one with ``gpus``) and reads its GPU nodes."""
    try:
        from tessera.backends.ray.backend import RayBackend
        from tessera.backends.ray.local_cluster import NODE_NAME, start_local_cluster
    except ImportError:
        raise InvalidRequestError("--backend", "ray needs the ray extra: pip install 'tessera[ray]'") from None
    local_dir = str(data_dir.absolute() / "ray" / "nodes")  # the local trial keeps its node files with its data
    if address is None:
        spec = DEFAULT_SIMULATED_SPEC if gpus.strip().lower() == AUTO_SPEC else gpus
        devices = parse_gpu_spec(spec, node=NODE_NAME)
        if len({d.model for d in devices}) > 1:
            raise InvalidRequestError("--gpus", f"a local Ray cluster is one node of one GPU model, not {spec!r}")
        address, started = start_local_cluster(data_dir, [(d.uuid, d.model) for d in devices])
        wait_s = NODES_WAIT_S
        how = "started" if started else "joined the"
        notice = f"{how} local Ray cluster at {address} (127.0.0.1, a single-host trial) with simulated GPUs {spec}"
        notice += f"; it outlives this server (stop it: kill -TERM $(cat {data_dir / 'ray' / 'pid'}))"
    else:
        notice, wait_s = f"joined the Ray cluster at {address}", 0.0
    backend = RayBackend(address) if notice.startswith("joined the Ray") else RayBackend(address, node_dir=local_dir)
    nodes = gpu_nodes(backend, wait_s)
    if not nodes:
        raise TesseraError("the Ray cluster declares no GPUs (tessera/<UUID> resources): see docs/ray.md")
    pool = pool_of(nodes)
    probe = SimulatedProbe([d for devs in pool.devices for d in devs])
    return RaySetup(backend, pool, probe, notice, NodeWatch(backend, pool_nodes(nodes)))


def gpu_nodes(backend: RayBackend, wait_s: float) -> list[RayNode]:
    """The cluster's nodes with GPUs, waiting up to ``wait_s`` for a first one (a head that has just started)."""
    deadline_s = time.monotonic() + wait_s
    while True:
        nodes = [node for node in backend.inventory() if node.gpu_uuids]
        if nodes or time.monotonic() >= deadline_s:
            return nodes
        time.sleep(0.2)


def pool_of(nodes: list[RayNode]) -> Pool:
    """One pool node per Ray node with GPUs: its CPUs, memory and GPUs as the cluster declares them."""
    both = pool_nodes(nodes)
    return Pool([node.spec for node in both], [node.devices for node in both])


def pool_nodes(nodes: Sequence[RayNode]) -> list[PoolNode]:
    """The Ray nodes with GPUs as the server's pool nodes (the others get no work: they are not in the pool)."""
    out: list[PoolNode] = []
    for node in nodes:
        if not node.gpu_uuids or node.gpu_model is None:
            continue
        model = resolve_model(node.gpu_model)
        gpus = tuple(
            GpuDevice(i, uuid, model.name, model.mem_mib, uuid.startswith(SIMULATED_UUID_PREFIX), node.name)
            for i, uuid in enumerate(node.gpu_uuids)
        )
        out.append(PoolNode(NodeSpec(node.name, node.cpu_milli, node.mem_mib, len(gpus), model.name), gpus))
    return out


class NodeWatch:
    """Reads the cluster's nodes every ``interval_s`` on its own thread; ``latest`` (the loop's ``NodeFeed``) hands
    the nodes over once each time they changed, without waiting. A failed read is logged and the last nodes kept: a
    node leaves the pool only when the cluster says it is gone."""

    def __init__(self, backend: RayBackend, nodes: list[PoolNode], interval_s: float = NODES_POLL_S) -> None:
        self.backend, self.interval_s = backend, interval_s
        self._seen = nodes  # what the pool was made of
        self._news: list[PoolNode] | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="tessera-ray-nodes", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def latest(self) -> list[PoolNode] | None:
        with self._lock:
            news, self._news = self._news, None
        return news

    def read(self) -> None:
        """One read of the cluster's nodes (the thread's step; tests call it to skip the wait)."""
        try:
            nodes = pool_nodes(self.backend.inventory())
        except Exception as error:  # a cluster that does not answer, a node declared wrong: keep the last nodes
            log.warning("reading the Ray cluster's nodes failed (%s); keeping the last known nodes", error)
            return
        with self._lock:
            if nodes != self._seen:
                self._seen, self._news = nodes, nodes

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.read()
