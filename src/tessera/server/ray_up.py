"""``tessera up --backend ray``: the Ray backend and the GPU pool read from the Ray cluster.

With ``--ray-address`` the server joins that cluster; without, it starts (or finds again) a single-host one on
127.0.0.1 whose GPUs are those of ``--gpus`` (``backends.ray.local_cluster``) and says so. The pool is the cluster's
GPU nodes at start (each Ray node one Tessera node, CPUs and memory as Ray reports them). Imports Ray only through
``tessera.backends.ray``, and only when called: a server without the ``ray`` extra runs the local backend as before.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tessera.backends.base import Backend
from tessera.core.catalog import resolve_model
from tessera.core.cluster import NodeSpec
from tessera.errors import InvalidRequestError, TesseraError
from tessera.gpu.discovery import AUTO_SPEC, DEFAULT_SIMULATED_SPEC
from tessera.gpu.gpus import SIMULATED_UUID_PREFIX, GpuDevice, SimulatedProbe, parse_gpu_spec
from tessera.server.pool import Pool

if TYPE_CHECKING:
    from tessera.backends.ray.backend import RayBackend
    from tessera.backends.ray.nodes import RayNode

NODES_WAIT_S = 60.0  # how long a just-started local head may take to register its node


@dataclass(frozen=True, slots=True)
class RaySetup:
    backend: Backend
    pool: Pool
    probe: SimulatedProbe  # the cluster's GPUs (no NVML on this host: usage is not read through Ray)
    notice: str  # one line for the operator: which cluster, started here or joined


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
    return RaySetup(backend, pool, SimulatedProbe([d for devs in pool.devices for d in devs]), notice)


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
    specs: list[NodeSpec] = []
    devices: list[list[GpuDevice]] = []
    for node in nodes:
        assert node.gpu_model is not None
        model = resolve_model(node.gpu_model)
        gpus = [
            GpuDevice(i, uuid, model.name, model.mem_mib, uuid.startswith(SIMULATED_UUID_PREFIX), node.name)
            for i, uuid in enumerate(node.gpu_uuids)
        ]
        specs.append(NodeSpec(node.name, node.cpu_milli, node.mem_mib, len(gpus), model.name))
        devices.append(gpus)
    return Pool(specs, devices)
