"""What the launcher asks the backend to hold a workload to (``server/workload_limits.py``): its request's memory
and CPU, else the server's default memory for its GPU share; the server's process limit and log cap; the handle's
note (its limits in words) in its ``started`` event. (Enforced by the local backend:
tests/backends/test_workload_limits.py.)"""

from __future__ import annotations

import pytest
from server_harness import MakeHarness

from tessera.backends.base import Handle
from tessera.errors import InvalidRequestError
from tessera.server.loop_values import started_text
from tessera.server.workload_limits import DEFAULT_PIDS_MAX, MIN_DEFAULT_MEM_MIB, WorkloadLimits


@pytest.mark.parametrize(
    ("requested_mib", "gpu_count", "expected_mib"),
    [
        (2048, 1, 2048),  # --mem wins
        (0, 1, 16 * 1024),  # on one GPU of a node of 4 GPUs and 64 GiB: a quarter, whatever its share of it
        (0, 2, 32 * 1024),
        (0, 0, 16 * 1024),  # no GPU: as one GPU
        (0, 8, 64 * 1024),  # never more than the node
    ],
)
def test_memory_limit_from_the_request_else_the_gpus_it_is_on(
    requested_mib: int, gpu_count: int, expected_mib: int
) -> None:
    assert WorkloadLimits().memory_mib(requested_mib, gpu_count, 64 * 1024, 4) == expected_mib


def test_memory_per_gpu_can_be_set_a_floor_holds_and_a_node_without_gpus_gives_all_its_memory() -> None:
    assert WorkloadLimits(mem_per_gpu_mib=4096).memory_mib(0, 2, 64 * 1024, 4) == 8192
    assert WorkloadLimits(mem_per_gpu_mib=100).memory_mib(0, 1, 64 * 1024, 4) == MIN_DEFAULT_MEM_MIB
    assert WorkloadLimits().memory_mib(0, 0, 8192, 0) == 8192


@pytest.mark.parametrize(
    ("limits", "field"),
    [
        ({"pids_max": -1}, "--workload-pids-max"),
        ({"pids_max": 3}, "--workload-pids-max"),
        ({"pids_max": 4_194_305}, "--workload-pids-max"),  # above the kernel's ceiling: pids.max refuses it
        ({"mem_per_gpu_mib": -5}, "--workload-mem-per-gpu"),
        ({"log_max_bytes": -1}, "--log-max-size"),
    ],
)
def test_bad_limits_name_their_option(limits: dict[str, int], field: str) -> None:
    with pytest.raises(InvalidRequestError) as raised:
        WorkloadLimits(**limits)
    assert raised.value.field == field


def test_the_launch_carries_the_request_s_limits_and_the_server_s(make_harness: MakeHarness) -> None:
    h = make_harness(gpus="2xA100-80GB")  # the harness's host: 32 CPUs, 128 GiB: 64 GiB per GPU
    asked = h.submit(command=["true"], mem="3GiB", cpu="2", gpus=1)
    half = h.submit(command=["true"], gpus=1, gpu_fraction=0.5)
    h.step()
    specs = {spec.workload_id: spec for spec in h.backend.launched}
    one, other = specs[str(asked["id"])], specs[str(half["id"])]
    assert (one.mem_max_mib, one.cpu_milli, one.pids_max) == (3072, 2000, DEFAULT_PIDS_MAX)
    assert (other.mem_max_mib, other.cpu_milli) == (64 * 1024, 0)  # half of one GPU: that GPU's part of the host
    assert one.log_max_bytes == WorkloadLimits().log_max_bytes


def test_the_launch_carries_the_server_s_own_limits(make_harness: MakeHarness) -> None:
    """The test above compares with the defaults, which a launcher that ignored ``tessera up``'s options would
    also send; these are not the defaults."""
    limits = WorkloadLimits(pids_max=100, mem_per_gpu_mib=3000, log_max_bytes=12_345)
    h = make_harness(gpus="2xA100-80GB", limits=limits)
    job = h.submit(command=["true"], gpus=2)
    h.step()
    (spec,) = h.backend.launched
    assert spec.workload_id == str(job["id"])
    assert (spec.pids_max, spec.mem_max_mib, spec.log_max_bytes) == (100, 6000, 12_345)


def test_the_started_event_says_what_the_workload_is_held_to() -> None:
    handle = Handle("7", "local", {"pid": 1}, note="limits: 4096 processes; NOT enforced here: memory limits")
    assert started_text(handle) == "started (local backend); limits: 4096 processes; NOT enforced here: memory limits"
    assert started_text(Handle("7", "fake", {})) == "started (fake backend)"
    assert Handle.from_json(handle.to_json()).note == handle.note and "note" not in Handle("7", "x", {}).to_json()
