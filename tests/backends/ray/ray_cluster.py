"""A real local Ray cluster for the ``ray`` tests: a head without GPUs and worker nodes with declared GPUs.

Ray moves off 127.0.0.1 when the machine has another interface, so the tests run only inside a network namespace
that has nothing but loopback (``unshare --net sh -c 'ip link set lo up && ...'``, as ``make test`` runs them);
elsewhere, or without the ``ray`` extra, they skip and say so, except under ``CI=true``, where they fail instead
(``ray_skip.py``). ``RAY_TMPDIR`` is a fresh directory per cluster.
"""

from __future__ import annotations

import importlib
import os
import socket
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ray_skip import skip_ray_tests

from tessera.backends.local_exec import package_root
from tessera.gpu.gpus import GpuDevice, parse_gpu_spec

try:
    ray: Any = importlib.import_module("ray")
except ImportError:
    skip_ray_tests("the ray extra is not installed (pip install 'tessera[ray]')", module=True)
from ray.cluster_utils import Cluster  # noqa: E402

from tessera.backends.ray.nodes import declare_node  # noqa: E402

WORKERS = {"w1": "2xA100-80GB", "w2": "2xA100-80GB"}
TIMEOUT_S = 60.0
# A removed node is declared dead after about period x threshold (Ray's defaults: 3 s x 5, 15 s); the lost-node
# tests wait for that, so it is shortened, with a timeout generous enough for a loaded 2-core machine.
HEALTH_CHECKS = {"health_check_period_ms": 1000, "health_check_timeout_ms": 3000, "health_check_failure_threshold": 4}


def loopback_only() -> bool:
    """True inside a network namespace whose only interface is ``lo``."""
    return [name for _, name in socket.if_nameindex()] == ["lo"]


def skip_unless_loopback_only() -> None:
    if not loopback_only():
        skip_ray_tests("Ray tests run only in a loopback-only network namespace: unshare --net (see the Makefile)")


def worker_devices(name: str, spec: str) -> list[GpuDevice]:
    return parse_gpu_spec(spec, node=name)


def add_worker(cluster: Any, name: str, spec: str, num_cpus: int = 2) -> Any:
    resources, labels = declare_node(name, [(d.uuid, d.model) for d in worker_devices(name, spec)])
    return cluster.add_node(num_cpus=num_cpus, num_gpus=0, resources=resources, labels=labels)


@contextmanager
def local_cluster() -> Iterator[Any]:
    """A head and the ``WORKERS`` nodes; the workers inherit this process's environment (PYTHONPATH: Tessera)."""
    skip_unless_loopback_only()
    tmp = Path(tempfile.mkdtemp(prefix="tessera-ray-", dir="/tmp"))
    os.environ["RAY_TMPDIR"] = str(tmp)
    os.environ["PYTHONPATH"] = package_root()  # absolute: workers start elsewhere
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 1,
            "num_gpus": 0,
            "labels": {"tessera.io/node": "head"},
            "_system_config": HEALTH_CHECKS,
        },
    )
    try:
        for name, spec in WORKERS.items():
            add_worker(cluster, name, spec)
        cluster.wait_for_nodes()
        yield cluster
    finally:
        if ray.is_initialized():
            ray.shutdown()
        cluster.shutdown()  # type: ignore[no-untyped-call]


def wait_until(condition: Callable[[], bool], timeout_s: float = TIMEOUT_S, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.1)


def is_running(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"
