"""The Ray backend against a real local Ray cluster (a head and two worker nodes of 2 simulated A100s each), in a
loopback-only network namespace. One backend (driver) serves the whole module, on the cluster the ``ray`` tests
share (``shared_ray_cluster``, ``tests/conftest.py``)."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ray_cluster import is_running, ray, wait_until

from tessera.backends.base import ExitStatus, GangRanks, GpuShare, Handle, LaunchSpec, rank_log_path
from tessera.backends.ray.backend import RayBackend, actor_name
from tessera.gpu.gpus import parse_gpu_spec
from tessera.gpu.isolation import isolation_env

pytestmark = pytest.mark.ray

NAMESPACE = "tessera-test"


@pytest.fixture(scope="module")
def cluster(shared_ray_cluster: Any) -> Any:
    return shared_ray_cluster


@pytest.fixture(scope="module")
def backend(cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayBackend]:
    node_dir = tmp_path_factory.mktemp("nodes")
    backend = RayBackend(cluster.address, namespace=NAMESPACE, node_dir=str(node_dir), progress_wait_s=0.5)
    yield backend
    backend.shutdown()  # this process leaves the shared cluster: the next module's server joins it afresh


def gpu(node: str, index: int) -> str:
    return parse_gpu_spec("2xA100-80GB", node=node)[index].uuid


def spec(
    workload_id: str, script: str, log_dir: Path, node: str, gpus: tuple[tuple[str, int], ...] = (), cpu_milli: int = 0
) -> LaunchSpec:
    """A shell workload placed as Tessera would: on ``node``, with these (uuid, milli) shares and their env."""
    devices = [d for n in {node} for d in parse_gpu_spec("2xA100-80GB", node=n) if d.uuid in {u for u, _ in gpus}]
    milli = gpus[0][1] if gpus else 0
    env = isolation_env(workload_id, devices, milli, 0)
    shares = tuple(GpuShare(uuid, m) for uuid, m in gpus)
    argv = ("sh", "-c", script)
    log_path = log_dir / f"{workload_id}.log"
    return LaunchSpec(workload_id, argv, env, log_path, node=node, gpus=shares, cpu_milli=cpu_milli)


def wait_for_ends(backend: RayBackend, *ids: str, timeout_s: float = 60.0) -> dict[str, ExitStatus]:
    ended: dict[str, ExitStatus] = {}

    def all_ended() -> bool:
        ended.update({status.workload_id: status for status in backend.poll()})
        return set(ids) <= set(ended)

    wait_until(all_ended, timeout_s, f"the ends of {ids}")
    return ended


def wait_for_log(backend: RayBackend, path: Path, text: str, timeout_s: float = 60.0) -> None:
    """Polls (which streams the logs) until ``path`` holds ``text``."""

    def found() -> bool:
        backend.poll()
        return path.exists() and text in path.read_text()

    wait_until(found, timeout_s, f"{text!r} in {path.name}")


def pids_in(path: Path) -> list[int]:
    return [int(word) for word in path.read_text().split()] if path.exists() else []


TWO_PROCESSES = "sleep 300 & echo $! > {d}/pids; echo $$ >> {d}/pids; echo started; wait"


def test_nodes_and_gpus_come_from_the_cluster(backend: RayBackend) -> None:
    nodes = {node.name: node for node in backend.inventory()}
    assert {"head", "w1", "w2"} <= set(nodes)
    assert nodes["head"].gpu_uuids == () and nodes["head"].gpu_model is None
    assert nodes["w1"].gpu_uuids == (gpu("w1", 0), gpu("w1", 1))
    assert nodes["w2"].gpu_model == "A100-80GB"
    assert nodes["w1"].cpu_milli == 2000
    assert {n.name for n in backend.nodes()} >= {"head", "w1", "w2"}


def test_runs_on_the_chosen_node_and_gpu_with_logs_and_exit_code(backend: RayBackend, tmp_path: Path) -> None:
    script = 'echo "cvd=$CUDA_VISIBLE_DEVICES milli=$TESSERA_GPU_MILLI"; echo oops >&2; exit 7'
    handle = backend.launch(spec("place-1", script, tmp_path, "w2", ((gpu("w2", 1), 1000),), cpu_milli=500))
    assert handle.backend == "ray" and handle.data["node"] == "w2"
    found = backend.find("place-1")
    w2 = next(n for n in backend.inventory() if n.name == "w2")
    assert found is not None and found.data["node_id"] == w2.node_id  # the actor really runs on w2
    ended = wait_for_ends(backend, "place-1")
    assert ended["place-1"].exit_code == 7
    log = (tmp_path / "place-1.log").read_text()
    assert f"cvd={gpu('w2', 1)} milli=1000" in log and "oops" in log
    assert backend.find("place-1") is None  # ended and reported: its actor is gone


def test_a_gang_runs_its_ranks_on_the_node_and_each_ranks_log_comes_back(backend: RayBackend, tmp_path: Path) -> None:
    script = (
        'echo "rank=$RANK local=$LOCAL_RANK world=$WORLD_SIZE port=$MASTER_PORT cvd=$CUDA_VISIBLE_DEVICES"; '
        'if [ "$RANK" = 1 ]; then exit 3; fi; trap "echo SIGTERM came; exit 143" TERM; while :; do sleep 0.05; done'
    )
    shares = ((gpu("w1", 0), 1000), (gpu("w1", 1), 1000))
    launch = dataclasses.replace(spec("gang-1", script, tmp_path, "w1", shares), gang=GangRanks(2, (0, 1)))
    handle = backend.launch(launch)
    assert handle.data["log_ranks"] == "1"
    found = backend.find("gang-1")
    assert found is not None and found.data["log_ranks"] == "1"  # a server that adopts it reads rank 1's log too
    assert wait_for_ends(backend, "gang-1")["gang-1"].exit_code == 3  # rank 1's failure stopped rank 0
    main, rank1 = (rank_log_path(tmp_path / "gang-1.log", rank).read_text() for rank in (0, 1))
    port = main.split("port=")[1].split()[0]
    assert f"rank=0 local=0 world=2 port={port} cvd={gpu('w1', 0)},{gpu('w1', 1)}" in main and int(port) > 0
    assert "rank 1 exited with code 3: stopping the other ranks" in main and "SIGTERM came" in main
    assert f"rank=1 local=1 world=2 port={port}" in rank1 and "rank=0" not in rank1


def test_three_fractional_workloads_share_one_gpu(backend: RayBackend, tmp_path: Path) -> None:
    uuid = gpu("w1", 0)
    ids = [f"third-{i}" for i in range(3)]
    script = f'echo "on $CUDA_VISIBLE_DEVICES"; while [ ! -e {tmp_path}/go ]; do sleep 0.1; done'
    for workload_id in ids:
        backend.launch(spec(workload_id, script, tmp_path, "w1", ((uuid, 333),)))
    for workload_id in ids:  # all three run at once: each waits for the file written only below
        wait_for_log(backend, tmp_path / f"{workload_id}.log", f"on {uuid}")
    free = ray.available_resources().get(f"tessera/{uuid}", 0.0)
    assert free == pytest.approx(0.001, abs=1e-6)
    (tmp_path / "go").touch()
    assert {s.exit_code for s in wait_for_ends(backend, *ids).values()} == {0}


def test_twenty_workloads_of_0_18_gpu_on_2x2_gpus_are_all_placed(backend: RayBackend, tmp_path: Path) -> None:
    """ray#52133: Ray alone places only 19 of these; with Tessera choosing each GPU all 20 run at once."""
    gpus = [(node, gpu(node, i)) for node in ("w1", "w2") for i in range(2)]
    ids = [f"frac-{i}" for i in range(20)]
    script = f'echo "on $CUDA_VISIBLE_DEVICES"; while [ ! -e {tmp_path}/go ]; do sleep 0.2; done'
    start_s = time.monotonic()
    for i, workload_id in enumerate(ids):
        node, uuid = gpus[i % 4]  # five per GPU: 0.9 of each
        backend.launch(spec(workload_id, script, tmp_path, node, ((uuid, 180),)))
    for workload_id in ids:
        wait_for_log(backend, tmp_path / f"{workload_id}.log", "on SIM-", timeout_s=240)
    print(f"20 x 0.18 GPU: all running {time.monotonic() - start_s:.1f} s after the first launch")
    (tmp_path / "go").touch()
    assert {s.exit_code for s in wait_for_ends(backend, *ids, timeout_s=120).values()} == {0}


def test_stop_with_grace_honoured_and_forced_leaves_nothing(backend: RayBackend, tmp_path: Path) -> None:
    polite = "trap 'echo got TERM; exit 3' TERM; echo started; while true; do sleep 0.1; done"
    stubborn = f"trap '' TERM; {TWO_PROCESSES.format(d=tmp_path)}"
    backend.launch(spec("polite", polite, tmp_path, "w1"))
    backend.launch(spec("stubborn", stubborn, tmp_path, "w2"))
    wait_for_log(backend, tmp_path / "polite.log", "started")
    wait_for_log(backend, tmp_path / "stubborn.log", "started")
    pids = pids_in(tmp_path / "pids")
    assert len(pids) == 2 and all(is_running(pid) for pid in pids)
    start_s = time.monotonic()
    backend.stop("polite", 10.0)
    backend.stop("stubborn", 1.0)
    ended = wait_for_ends(backend, "polite", "stubborn")
    assert ended["polite"].exit_code == 3 and "got TERM" in (tmp_path / "polite.log").read_text()
    assert ended["stubborn"].exit_code == -signal.SIGKILL
    assert time.monotonic() - start_s >= 1.0  # the grace was given
    assert not [pid for pid in pids if is_running(pid)]


def test_ray_kill_of_the_actor_leaves_no_process(backend: RayBackend, tmp_path: Path) -> None:
    backend.launch(spec("killed", TWO_PROCESSES.format(d=tmp_path), tmp_path, "w1"))
    wait_for_log(backend, tmp_path / "killed.log", "started")
    pids = pids_in(tmp_path / "pids")
    ray.kill(ray.get_actor(actor_name("killed"), namespace=NAMESPACE), no_restart=True)
    assert wait_for_ends(backend, "killed")["killed"].exit_code is None  # unknown: the server's policy decides
    wait_until(lambda: not [pid for pid in pids if is_running(pid)], 10, "the workload's processes to end")


DRIVER = """
import json, sys, time
from pathlib import Path
from tessera.backends.base import LaunchSpec
from tessera.backends.ray.backend import RayBackend
address, namespace, node_dir, out = sys.argv[1:5]
backend = RayBackend(address, namespace=namespace, node_dir=node_dir)
handles = []
for i, script in enumerate(sys.argv[5:]):
    spec = LaunchSpec(f"adopt-{i}", ("sh", "-c", script), {}, Path(out) / f"adopt-{i}.log", node="w1")
    handles.append(backend.launch(spec).to_json())
Path(out, "handles.json").write_text(json.dumps(handles))
while True:
    backend.poll()
    time.sleep(0.2)
"""


def test_workloads_outlive_a_server_killed_with_sigkill_and_are_readopted_never_relaunched(
    cluster: Any, backend: RayBackend, tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    long = f"echo $$ >> {runs}; echo started; while [ ! -e {tmp_path}/go ]; do sleep 0.1; done; echo done; exit 5"
    short = f"echo $$ >> {runs}; echo quick; exit 4"  # ends while no server watches
    node_dir = str(tmp_path / "nodes")
    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER, cluster.address, NAMESPACE, node_dir, str(tmp_path), long, short],
        env={**os.environ},
    )
    try:
        wait_until(lambda: (tmp_path / "handles.json").exists() and len(pids_in(runs)) == 2, 90, "both launches")
    finally:
        driver.send_signal(signal.SIGKILL)
        driver.wait()
    handles = [Handle.from_json(h) for h in json.loads((tmp_path / "handles.json").read_text())]
    # The restarted server: it finds both by name (also without the stored handles) and adopts them.
    assert {h.workload_id for h in handles if backend.find(h.workload_id) is not None} == {"adopt-0", "adopt-1"}
    for handle in handles:
        backend.adopt(handle)
    assert wait_for_ends(backend, "adopt-1")["adopt-1"].exit_code == 4  # its end was kept while no server watched
    (tmp_path / "go").touch()
    assert wait_for_ends(backend, "adopt-0")["adopt-0"].exit_code == 5
    assert "done" in (tmp_path / "adopt-0.log").read_text()
    assert len(pids_in(runs)) == 2  # each ran exactly once
    assert backend.find("adopt-0") is None and backend.find("adopt-1") is None
