"""Launching many workloads through the whole control plane: the Ray backend on a local multi-node Ray cluster
against the local backend, in the same run (issue 14's speed bullet).

For each backend an in-process server (``build_server``: SQLite store, the scheduler loop on its own thread, as
``tessera up`` runs it) gets ``--count`` submissions at once, each a fractional share (``--share`` of a GPU, 0.1 CPU)
of a simulated A100-80GB; every workload touches a marker file when its process starts and then waits for a stop
file. Measured from the submission until each marker exists (polled every 50 ms): the first and the last workload
running, and until every workload is recorded running in the store. Then the stop file ends them all and the time
until every end is recorded is measured too.

- Ray: a head without GPUs and ``--workers`` nodes of ``--gpus-per-worker`` declared GPUs each
  (``ray.cluster_utils.Cluster``: every node is a raylet on this host), ``--backend ray --ray-address``; one
  detached actor per workload, pinned to the node and GPU share Tessera chose.
- Local: one node with the same number of GPUs, workloads as processes of this host (``--run-as server``).

Ray moves off 127.0.0.1 when the host has another interface, so run it in a loopback-only network namespace:
``unshare --net sh -c 'ip link set lo up && PYTHONPATH=src python bench/ray_launch.py'``. Prints one JSON object per
backend and one with the ratio of Ray's time to all running over the local backend's.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tessera.api import WorkloadSpec
from tessera.backends.local_exec import package_root
from tessera.server.loop_values import LoopConfig
from tessera.server.pool import HostResources
from tessera.server.store.models import WorkloadRow
from tessera.server.submit import Principal, workload_row
from tessera.server.up import Server, UpConfig, build_server, start_loop

TIMEOUT_S = 900.0
SCRIPT = "touch {d}/$TESSERA_WORKLOAD_ID; while [ ! -e {d}/stop ]; do sleep 0.5; done"


def submit(server: Server, count: int, share: float, markers: Path) -> None:
    """``count`` submissions, validated as the API validates them, stored in one transaction."""
    store, pool = server.ctx.store, server.ctx.pool
    queues, admin, now = store.queues(), Principal(None, True), time.time()
    rows: list[WorkloadRow] = []
    for i in range(count):
        command = ["sh", "-c", SCRIPT.format(d=markers)]
        spec = WorkloadSpec(command=command, name=f"launch-{i}", gpus=1, gpu_fraction=share, cpu=0.1)
        rows.append(workload_row(spec, admin, queues, pool, now))
    with store.session() as session, session.begin():
        session.add_all(rows)


def wait(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not after {TIMEOUT_S} s")
        time.sleep(0.05)


def measure(name: str, server: Server, count: int, share: float, work: Path) -> dict[str, Any]:
    """Submit ``count`` workloads to the running ``server``; the times until they run and until they ended."""
    markers = work / "markers"
    markers.mkdir()
    store = server.ctx.store
    thread = start_loop(server)
    try:
        start_s = time.monotonic()
        submit(server, count, share, markers)
        first: list[float] = []

        def started() -> int:
            seen = sum(1 for _ in markers.iterdir())
            if seen and not first:
                first.append(time.monotonic() - start_s)
            return seen

        wait(lambda: started() >= count, f"{name}: all {count} running")
        all_running_s = time.monotonic() - start_s
        wait(lambda: len(store.ids_in("running")) >= count, f"{name}: all recorded running")
        recorded_s = time.monotonic() - start_s
        stop_s = time.monotonic()
        (markers / "stop").touch()
        wait(lambda: not store.ids_in("running") and not store.ids_in("pending"), f"{name}: all ended")
        ended_s = time.monotonic() - stop_s
    finally:
        server.stopping.set()
        thread.join(timeout=60)
        for close in server.closers:
            close()
        server.backend.close()
    return {
        "backend": name,
        "workloads": count,
        "first_running_s": round(first[0], 2),
        "all_running_s": round(all_running_s, 2),
        "all_recorded_running_s": round(recorded_s, 2),
        "all_ended_after_stop_s": round(ended_s, 2),
    }


def local_run(count: int, share: float, gpus: int, work: Path) -> dict[str, Any]:
    data = work / "local"
    data.mkdir()
    loop = LoopConfig(run_dir=data)
    config = UpConfig(data_dir=data, gpus=f"{gpus}xA100-80GB", loop=loop, run_as="server")
    server = build_server(config, host=HostResources(cpu_milli=(count + 10) * 100, mem_mib=64 * 1024))
    result = measure("local", server, count, share, data)
    result["nodes"] = 1
    return result


def ray_run(count: int, share: float, workers: int, gpus_per_worker: int, work: Path) -> dict[str, Any]:
    from ray.cluster_utils import Cluster

    from tessera.backends.ray.nodes import declare_node
    from tessera.gpu.gpus import parse_gpu_spec

    tmp = work / "ray-tmp"
    tmp.mkdir()
    os.environ["RAY_TMPDIR"] = str(tmp)
    os.environ["PYTHONPATH"] = package_root()  # the node's workers import Tessera's actor and guard
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    start_s = time.monotonic()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "num_gpus": 0})
    try:
        for w in range(workers):
            name = f"w{w + 1}"
            devices = parse_gpu_spec(f"{gpus_per_worker}xA100-80GB", node=name)
            resources, labels = declare_node(name, [(d.uuid, d.model) for d in devices])
            cpus = count // workers + 2  # Ray's CPUs are logical: room for every actor's 0.1
            cluster.add_node(num_cpus=cpus, num_gpus=0, resources=resources, labels=labels)
        cluster.wait_for_nodes()
        cluster_s = time.monotonic() - start_s
        data = work / "ray"
        data.mkdir()
        config = UpConfig(data_dir=data, backend="ray", ray_address=cluster.address, loop=LoopConfig(run_dir=data))
        server = build_server(config)
        result = measure("ray", server, count, share, data)
        result["nodes"] = workers
        result["cluster_start_s"] = round(cluster_s, 2)
        return result
    finally:
        import ray

        ray.shutdown()
        cluster.shutdown()  # type: ignore[no-untyped-call]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=200)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--gpus-per-worker", type=int, default=4)
    parser.add_argument("--share", type=float, default=0.04, help="GPU fraction per workload")
    args = parser.parse_args()
    if args.count * args.share > args.workers * args.gpus_per_worker:
        parser.error("--count x --share is more than the cluster's GPUs")
    with tempfile.TemporaryDirectory(prefix="ray-launch-") as tmp:
        work = Path(tmp)
        local = local_run(args.count, args.share, args.workers * args.gpus_per_worker, work)
        print(json.dumps(local), flush=True)
        ray = ray_run(args.count, args.share, args.workers, args.gpus_per_worker, work)
        print(json.dumps(ray), flush=True)
    ratio = ray["all_running_s"] / local["all_running_s"]
    print(json.dumps({"ray_over_local_all_running": round(ratio, 1), "cpus": os.cpu_count()}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
