"""A gang across Ray nodes (``LaunchSpec.gang_parts``) on the real local cluster the ``ray`` tests share (nodes
``w1`` and ``w2`` of 2 simulated A100s each, loopback-only network namespace): 3 ranks, 2 on ``w1`` (rank 0's
node, the workload's own actor) and 1 on ``w2`` (a part's actor), as one workload with one handle."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ray_cluster import is_running, ray, wait_until

from tessera.backends.base import ExitStatus, GangPart, GangRanks, GpuShare, Handle, LaunchSpec, rank_log_path
from tessera.backends.ray.backend import RayBackend, actor_name
from tessera.backends.ray.parts import part_log_path
from tessera.core.errors import InvalidRequestError
from tessera.gpu.gpus import parse_gpu_spec
from tessera.gpu.isolation import isolation_env

pytestmark = pytest.mark.ray

NAMESPACE = "tessera-test-gang"
SAYS = (
    'echo "rank=$RANK local=$LOCAL_RANK world=$WORLD_SIZE addr=$MASTER_ADDR port=$MASTER_PORT '
    'cvd=$CUDA_VISIBLE_DEVICES"'
)
ON_TERM = 'trap "echo SIGTERM came; exit 143" TERM'


@pytest.fixture(scope="module")
def cluster(shared_ray_cluster: Any) -> Any:
    return shared_ray_cluster


@pytest.fixture(scope="module")
def node_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("nodes"))


@pytest.fixture(scope="module")
def backend(cluster: Any, node_dir: str) -> Iterator[RayBackend]:
    backend = RayBackend(cluster.address, namespace=NAMESPACE, node_dir=node_dir, progress_wait_s=0.5)
    yield backend
    backend.shutdown()  # this process leaves the shared cluster: the next module's server joins it afresh


def gpu(node: str, index: int) -> str:
    return parse_gpu_spec("2xA100-80GB", node=node)[index].uuid


def gang_spec(workload_id: str, script: str, log_dir: Path) -> LaunchSpec:
    """Ranks 0 and 1 on ``w1`` (both its GPUs), rank 2 on ``w2`` (its first GPU), as the launcher gives them."""
    w1 = parse_gpu_spec("2xA100-80GB", node="w1")
    env = isolation_env(workload_id, w1, 1000, 0)
    shares = tuple(GpuShare(d.uuid, 1000) for d in w1)
    part = GangPart("w2", (2,), (GpuShare(gpu("w2", 0), 1000),))
    spec = LaunchSpec(workload_id, ("sh", "-c", script), env, log_dir / f"{workload_id}.log", node="w1", gpus=shares)
    return dataclasses.replace(spec, gang=GangRanks(3, (0, 1)), gang_parts=(part,))


def logs(log_dir: Path, workload_id: str) -> list[str]:
    return [rank_log_path(log_dir / f"{workload_id}.log", rank).read_text() for rank in range(3)]


def wait_for_ends(backend: RayBackend, *ids: str, timeout_s: float = 90.0) -> dict[str, ExitStatus]:
    ended: dict[str, ExitStatus] = {}

    def all_ended() -> bool:
        ended.update({status.workload_id: status for status in backend.poll()})
        return set(ids) <= set(ended)

    wait_until(all_ended, timeout_s, f"the ends of {ids}")
    return ended


def wait_for_ranks(backend: RayBackend, log_dir: Path, workload_id: str, text: str = "rank=") -> None:
    """Polls (which brings the logs of every part here) until each rank's log holds ``text``."""

    def found() -> bool:
        backend.poll()
        paths = [rank_log_path(log_dir / f"{workload_id}.log", rank) for rank in range(3)]
        return all(path.exists() and text in path.read_text() for path in paths)

    wait_until(found, 90.0, f"{text!r} in the log of each rank of {workload_id}")


def pids_in(path: Path) -> list[int]:
    return [int(word) for word in path.read_text().split()] if path.exists() else []


def no_actor(name: str) -> bool:
    try:
        ray.get_actor(name, namespace=NAMESPACE)
    except ValueError:
        return True
    return False


def test_the_ranks_span_two_nodes_with_one_master_and_the_first_failure_stops_the_other_part(
    backend: RayBackend, tmp_path: Path
) -> None:
    wait_rest = f"while [ ! -e {tmp_path}/up.0 ] || [ ! -e {tmp_path}/up.1 ]; do sleep 0.05; done"
    script = (
        f"{SAYS}; {ON_TERM}; touch {tmp_path}/up.$RANK; "
        f'if [ "$RANK" = 2 ]; then {wait_rest}; exit 3; fi; while :; do sleep 0.05; done'
    )
    handle = backend.launch(gang_spec("xg-fail", script, tmp_path))
    assert handle.data["part_actors"] == "tessera-xg-fail-part1"
    assert (handle.data["node"], handle.data["part_nodes"], handle.data["log_ranks"]) == ("w1", "w2", "1")
    assert set(Handle.from_json(handle.to_json()).data) == set(handle.data)  # JSON scalars only
    assert wait_for_ends(backend, "xg-fail")["xg-fail"].exit_code == 3  # rank 2's code, though 0 and 1 got SIGTERM
    w1 = next(node for node in backend.inventory() if node.name == "w1")
    rank0, rank1, rank2 = logs(tmp_path, "xg-fail")
    port = rank0.split("port=")[1].split()[0]
    assert int(port) > 0
    assert f"rank=0 local=0 world=3 addr={w1.address} port={port} cvd={gpu('w1', 0)},{gpu('w1', 1)}" in rank0
    assert f"rank=1 local=1 world=3 addr={w1.address} port={port}" in rank1
    assert f"rank=2 local=0 world=3 addr={w1.address} port={port} cvd={gpu('w2', 0)}" in rank2
    assert "SIGTERM came" in rank0 and "SIGTERM came" in rank1 and "SIGTERM" not in rank2
    assert "rank 2 exited with code 3" in part_log_path(tmp_path / "xg-fail.log", 1).read_text()
    assert backend.find("xg-fail") is None and no_actor("tessera-xg-fail-part1")  # every actor cleaned up


def test_stop_ends_every_part(backend: RayBackend, tmp_path: Path) -> None:
    script = f"echo $$ >> {tmp_path}/pids; {SAYS}; {ON_TERM}; while :; do sleep 0.05; done"
    backend.launch(gang_spec("xg-stop", script, tmp_path))
    wait_for_ranks(backend, tmp_path, "xg-stop")
    pids = pids_in(tmp_path / "pids")
    assert len(pids) == 3 and all(is_running(pid) for pid in pids)
    backend.stop("xg-stop", 10.0)
    assert wait_for_ends(backend, "xg-stop")["xg-stop"].exit_code == 143
    assert all("SIGTERM came" in text for text in logs(tmp_path, "xg-stop"))
    assert not [pid for pid in pids if is_running(pid)]
    assert backend.find("xg-stop") is None and no_actor("tessera-xg-stop-part1")


def test_a_new_backend_adopts_every_part_and_reports_the_end_of_all(
    cluster: Any, node_dir: str, tmp_path: Path
) -> None:
    script = (
        f'echo $$ >> {tmp_path}/pids; echo "start rank=$RANK"; while [ ! -e {tmp_path}/go ]; do sleep 0.1; done; '
        'echo "done rank=$RANK"; if [ "$RANK" = 2 ]; then exit 5; fi'
    )
    first = RayBackend(cluster.address, namespace=NAMESPACE, node_dir=node_dir, progress_wait_s=0.5)
    handle = first.launch(gang_spec("xg-adopt", script, tmp_path))
    wait_for_ranks(first, tmp_path, "xg-adopt", "start rank=")
    first.close()  # the server is gone; its workload runs on
    second = RayBackend(cluster.address, namespace=NAMESPACE, node_dir=node_dir, progress_wait_s=0.5)
    found = second.find("xg-adopt")  # also without the stored handle: every part named
    assert found is not None
    assert {key: found.data[key] for key in found.data} == {key: handle.data[key] for key in found.data}
    assert found.data["part_actors"] == "tessera-xg-adopt-part1" and found.data["log_ranks"] == "1"
    second.adopt(Handle.from_json(handle.to_json()))
    assert second.tracked() == {"xg-adopt"}
    (tmp_path / "go").touch()
    assert wait_for_ends(second, "xg-adopt")["xg-adopt"].exit_code == 5
    for rank, text in enumerate(logs(tmp_path, "xg-adopt")):  # each line once: read on from where it was
        assert (text.count(f"start rank={rank}"), text.count(f"done rank={rank}")) == (1, 1), text
    assert len(pids_in(tmp_path / "pids")) == 3  # each rank started once
    assert second.find("xg-adopt") is None and no_actor("tessera-xg-adopt-part1")


def test_a_part_gone_while_no_server_watched_ends_the_workload_unknown_and_stops_the_rest(
    cluster: Any, node_dir: str, tmp_path: Path
) -> None:
    """As for a launch cut short (the server died before it started a part): ``find`` names the part, and the
    part that is not there is an end of unknown code; nothing is started again, the other part is stopped."""
    script = f"echo $$ >> {tmp_path}/pids; {SAYS}; {ON_TERM}; while :; do sleep 0.05; done"
    first = RayBackend(cluster.address, namespace=NAMESPACE, node_dir=node_dir, progress_wait_s=0.5)
    first.launch(gang_spec("xg-gone", script, tmp_path))
    wait_for_ranks(first, tmp_path, "xg-gone")
    first.close()
    pids = pids_in(tmp_path / "pids")
    ray.kill(ray.get_actor(actor_name("xg-gone") + "-part1", namespace=NAMESPACE), no_restart=True)
    second = RayBackend(cluster.address, namespace=NAMESPACE, node_dir=node_dir, progress_wait_s=0.5)
    found = second.find("xg-gone")
    assert found is not None and found.data["part_nodes"] == "w2"
    second.adopt(found)
    assert wait_for_ends(second, "xg-gone")["xg-gone"].exit_code is None
    rank0, rank1, _ = logs(tmp_path, "xg-gone")
    assert "SIGTERM came" in rank0 and "SIGTERM came" in rank1  # stopped with a grace, not killed
    wait_until(lambda: not [pid for pid in pids if is_running(pid)], 10, "the ranks' processes to end")
    assert len(pids) == 3 and second.find("xg-gone") is None


def test_a_part_that_cannot_be_started_fails_the_launch_and_leaves_no_actor(
    backend: RayBackend, tmp_path: Path
) -> None:
    """Its name taken (an earlier run's leftover): the launch fails naming ``gang_parts``, and the workload's own
    actor, started already, is killed (its guard with it), so nothing of the launch runs on."""
    # any actor holds a name from its creation on (a class the workers can import: not one of this module)
    leftover = ray.remote(argparse.Namespace).options(name="tessera-xg-dup-part1", namespace=NAMESPACE, num_cpus=0)
    leftover = leftover.remote()
    try:
        assert not no_actor("tessera-xg-dup-part1")
        with pytest.raises(InvalidRequestError) as caught:
            backend.launch(gang_spec("xg-dup", f"echo $$ >> {tmp_path}/pids; sleep 300", tmp_path))
        assert caught.value.field == "gang_parts"
        assert "xg-dup" not in backend.tracked()
        wait_until(lambda: no_actor(actor_name("xg-dup")), 30, "the workload's actor to be gone")
        wait_until(lambda: not [p for p in pids_in(tmp_path / "pids") if is_running(p)], 10, "no rank left")
    finally:
        ray.kill(leftover, no_restart=True)
