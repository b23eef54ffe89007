"""A gang across Ray nodes without a cluster: the parts a launch is checked into and how its handle names them
(``parts.py``), each part's environment, and the rule for the workload's end over its actors (``WorkloadWatch``:
the first failure's code, the others stopped then, the end only once every actor ended and cleaned up)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from ray_skip import skip_ray_tests

from tessera.backends.base import GangPart, GangRanks, GpuShare, Handle, LaunchSpec
from tessera.backends.ray.nodes import RayNode
from tessera.backends.ray.parts import PartRef, part_env, part_fields, part_log_path, parts_of, plan_parts
from tessera.core.errors import InvalidRequestError, TesseraError

try:
    from tessera.backends.ray.watch import ActorWatch, WorkloadWatch
except ImportError:
    skip_ray_tests("the ray extra is not installed (pip install 'tessera[ray]')", module=True)

NODES = {
    name: RayNode(name, f"id-{name}", f"10.0.0.{i}", 4000, 8192, (f"GPU-{name}-0", f"GPU-{name}-1"), "A100-80GB")
    for i, name in enumerate(("w1", "w2", "w3"), start=1)
}


def gang_spec(parts: tuple[GangPart, ...], main_ranks: tuple[int, ...] = (0, 1), port: int = 0) -> LaunchSpec:
    env = {"CUDA_VISIBLE_DEVICES": "GPU-w1-0,GPU-w1-1", "TESSERA_GPU_MILLI": "1000", "X": "1"}
    gang = GangRanks(4, main_ranks, master_port=port)
    return LaunchSpec("7", ("train",), env, node="w1", gang=gang, gang_parts=parts)


def test_parts_are_named_after_the_workloads_actor_and_checked() -> None:
    parts = (GangPart("w2", (2,), (GpuShare("GPU-w2-1", 1000),)), GangPart("w3", (3,)))
    planned = plan_parts(gang_spec(parts), NODES["w1"], NODES, "tessera-7")
    assert planned == [
        PartRef(1, "tessera-7-part1", "w2", "id-w2", (2,)),
        PartRef(2, "tessera-7-part2", "w3", "id-w3", (3,)),
    ]
    assert plan_parts(LaunchSpec("7", ("x",), node="w1"), NODES["w1"], NODES, "tessera-7") == []


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        (LaunchSpec("7", ("x",), node="w1", gang_parts=(GangPart("w2", (1,)),)), "gang"),  # no ranks here
        (gang_spec((GangPart("w2", (0, 2, 3)),), main_ranks=(1,), port=29500), "gang"),  # rank 0 elsewhere
        (gang_spec((GangPart("w2", (2,)),)), "gang_parts"),  # rank 3 nowhere
        (gang_spec((GangPart("w2", (1, 2, 3)),)), "gang_parts"),  # rank 1 twice
        (gang_spec((GangPart("w2", (2, 3), (GpuShare("GPU-w1-0", 1000),)),)), "gang_parts"),  # a GPU of w1
    ],
)
def test_a_gang_across_nodes_that_cannot_be_right_is_refused_naming_the_field(spec: LaunchSpec, field: str) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        plan_parts(spec, NODES["w1"], NODES, "tessera-7")
    assert caught.value.field == field


def test_a_part_on_a_node_not_in_the_cluster_fails_the_launch() -> None:
    with pytest.raises(TesseraError, match="'w9' is not in the cluster"):
        plan_parts(gang_spec((GangPart("w9", (2, 3)),)), NODES["w1"], NODES, "tessera-7")


def test_a_part_sees_its_own_gpus_and_keeps_the_rest_of_the_environment() -> None:
    part = GangPart("w2", (2, 3), (GpuShare("GPU-w2-0", 500), GpuShare("GPU-w2-1", 500)))
    env = {**gang_spec(()).env, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=4096M"}
    assert part_env(env, part) == {
        "CUDA_VISIBLE_DEVICES": "GPU-w2-0,GPU-w2-1",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=4096M,1=4096M",
        "TESSERA_GPU_MILLI": "1000",
        "X": "1",
    }
    assert part_env({"X": "1"}, part) == {"X": "1"}  # a launch without GPU variables gets none


def test_the_handle_names_every_part_in_json_scalars_and_reads_them_back() -> None:
    parts = [PartRef(1, "tessera-7-part1", "w2", "id-w2", (2, 3)), PartRef(2, "tessera-7-part2", "w3", "id-w3", (4,))]
    fields = part_fields(parts)
    assert fields["part_ranks"] == "2,3;4" and fields["part_actors"] == "tessera-7-part1,tessera-7-part2"
    handle = Handle.from_json(Handle("7", "ray", {"actor": "tessera-7", **fields}).to_json())
    assert parts_of("7", handle.data) == tuple(parts)
    assert parts_of("7", {"actor": "tessera-7"}) == () and part_fields([]) == {}
    with pytest.raises(InvalidRequestError) as caught:
        parts_of("7", {**fields, "part_nodes": "w2"})  # two actors, one node
    assert caught.value.field == "handle"
    assert part_log_path(Path("/logs/7.log"), 2) == Path("/logs/7.log.part2")


class _Method:
    def __init__(self, calls: list[tuple[str, tuple[Any, ...]]], name: str) -> None:
        self.calls, self.name = calls, name

    def remote(self, *args: Any) -> object:
        self.calls.append((self.name, args))
        return object()


class _Actor:
    """What ``WorkloadWatch`` asks of an actor handle: ``stop.remote`` and ``cleanup.remote``, recorded."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self.stop, self.cleanup = _Method(self.calls, "stop"), _Method(self.calls, "cleanup")


def _workload(count: int) -> tuple[WorkloadWatch, list[_Actor]]:
    actors = [_Actor() for _ in range(count)]
    watches = [ActorWatch("7", actor, f"a{i}", 0, {}, {0: 0}) for i, actor in enumerate(actors)]
    return WorkloadWatch(Handle("7", "ray", {}), watches), actors


def _end(watch: ActorWatch, code: int | None) -> None:
    watch.call, watch.ended, watch.exit_code = None, True, code


def _cleaned(workload: WorkloadWatch) -> None:
    for watch in workload.actors:
        assert watch.cleaning or watch.actor is None
        watch.call, watch.cleaned = None, True


def test_the_first_failure_stops_the_other_parts_and_gives_the_code() -> None:
    workload, actors = _workload(3)
    _end(workload.actors[0], 0)
    _end(workload.actors[2], 3)
    assert workload.settle() is None
    assert actors[1].calls == [("stop", (5.0,))] and actors[0].calls == actors[2].calls == []  # only the running one
    _end(workload.actors[1], -15)  # stopped: not the first failure
    assert workload.settle() is None  # every actor cleans up first
    assert [name for actor in actors for name, _ in actor.calls].count("cleanup") == 3
    _cleaned(workload)
    status = workload.settle()
    assert status is not None and status.exit_code == 3


def test_all_parts_exiting_0_end_the_workload_with_0_and_a_stop_reaches_every_running_part() -> None:
    workload, actors = _workload(2)
    workload.stop(12.0)
    assert [actor.calls for actor in actors] == [[("stop", (12.0,))]] * 2
    _end(workload.actors[0], 0)
    _end(workload.actors[1], 0)
    assert workload.settle() is None
    _cleaned(workload)
    status = workload.settle()
    assert status is not None and status.exit_code == 0


def test_a_part_gone_is_a_failure_of_unknown_code_and_a_stop_asked_before_is_not_repeated() -> None:
    workload, actors = _workload(2)
    workload.stop(30.0)
    workload.actors[1].gone()
    assert workload.settle() is None
    assert actors[0].calls == [("stop", (30.0,))]  # the stop asked before holds: its grace is not shortened
    _end(workload.actors[0], -15)
    workload.settle()
    assert actors[1].calls == [("stop", (30.0,))]  # gone: no cleanup asked of it
    _cleaned(workload)
    status = workload.settle()
    assert status is not None and status.exit_code is None
