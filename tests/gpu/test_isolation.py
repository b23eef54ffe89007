"""The environment a launched workload gets, and the honest account of what enforces it."""

import os
import shutil
import socket
import stat
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tessera.core.errors import InvalidRequestError
from tessera.gpu.gpus import GpuDevice, parse_gpu_spec
from tessera.gpu.isolation import describe_isolation, isolation_env, memory_allowance_mib, mps_available


def _real(index: int, mem_mib: int = 81920, mig_parent: str = "") -> GpuDevice:
    uuid = f"MIG-{index}" if mig_parent else f"GPU-{index}"
    return GpuDevice(index, uuid, "A100-80GB", mem_mib, simulated=False, mig_parent_uuid=mig_parent)


def test_whole_gpus_are_named_by_uuid_without_memory_caps() -> None:
    env = isolation_env("w1", [_real(0), _real(1)], gpu_milli=1000, gpu_mem_mib=0)

    assert env == {
        "CUDA_VISIBLE_DEVICES": "GPU-0,GPU-1",
        "TESSERA_WORKLOAD_ID": "w1",
        "TESSERA_GPU_MILLI": "1000",
        "TESSERA_GPU_MEM_MIB": "81920",
        "TESSERA_GPU_MODEL": "A100-80GB",  # what a sim engine times itself on
    }


def test_a_share_of_one_gpu_gets_framework_memory_caps() -> None:
    env = isolation_env("w2", [_real(3)], gpu_milli=300, gpu_mem_mib=0)

    assert env["CUDA_VISIBLE_DEVICES"] == "GPU-3"
    assert env["TESSERA_GPU_MILLI"] == "300"
    assert env["TESSERA_GPU_MEM_MIB"] == str(81920 * 3 // 10)
    assert env["TESSERA_GPU_MEM_FRACTION"] == "0.3"
    assert env["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.3"
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in env


def test_a_stated_memory_request_sets_the_fraction_and_the_share() -> None:
    env = isolation_env("w3", [_real(0)], gpu_milli=0, gpu_mem_mib=20480)

    assert env["TESSERA_GPU_MEM_MIB"] == "20480"
    assert env["TESSERA_GPU_MEM_FRACTION"] == "0.25"
    assert env["TESSERA_GPU_MILLI"] == "250"


def test_fractions_round_down_so_a_cap_never_grows() -> None:
    env = isolation_env("w", [_real(0)], gpu_milli=0, gpu_mem_mib=10000)

    assert env["TESSERA_GPU_MEM_FRACTION"] == "0.122"  # 10000 / 81920 = 0.12207...
    assert isolation_env("w", [_real(0)], gpu_milli=290, gpu_mem_mib=0)["TESSERA_GPU_MEM_FRACTION"] == "0.29"


def test_cpu_only_workloads_see_no_gpu() -> None:
    env = isolation_env("cpu", [], gpu_milli=0, gpu_mem_mib=0)

    assert env["CUDA_VISIBLE_DEVICES"] == ""
    assert env["TESSERA_GPU_MILLI"] == "0" and env["TESSERA_GPU_MEM_MIB"] == "0"
    assert "TESSERA_GPU_MEM_FRACTION" not in env and "TESSERA_GPU_SIMULATED" not in env


def test_mps_limits_follow_the_share_per_visible_device() -> None:
    env = isolation_env("w4", [_real(0)], gpu_milli=300, gpu_mem_mib=0, mps=True, mps_pipe_dir="/run/mps")

    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30"
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=24576M"
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == "/run/mps"


def test_mps_limits_cover_every_visible_device_and_never_round_to_zero() -> None:
    whole = isolation_env("w", [_real(0), _real(1)], gpu_milli=1000, gpu_mem_mib=0, mps=True)
    tiny = isolation_env("w", [_real(0)], gpu_milli=1, gpu_mem_mib=0, mps=True)

    assert whole["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "100"
    assert whole["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=81920M,1=81920M"
    assert "CUDA_MPS_PIPE_DIRECTORY" not in whole
    assert tiny["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "1"


def test_simulated_devices_are_flagged() -> None:
    env = isolation_env("sim", parse_gpu_spec("T4"), gpu_milli=500, gpu_mem_mib=0)

    assert env["TESSERA_GPU_SIMULATED"] == "1"
    assert env["CUDA_VISIBLE_DEVICES"].startswith("SIM-")


@pytest.mark.parametrize(
    ("devices", "milli", "mem", "field"),
    [
        ([], 500, 0, "gpu_milli"),
        ([_real(0)], 0, 0, "gpu_milli"),
        ([_real(0)], 1500, 0, "gpu_milli"),
        ([_real(0)], 500, -1, "gpu_mem_mib"),
    ],
)
def test_inconsistent_shares_are_rejected(devices: list[GpuDevice], milli: int, mem: int, field: str) -> None:
    with pytest.raises(InvalidRequestError) as raised:
        isolation_env("w", devices, gpu_milli=milli, gpu_mem_mib=mem)
    assert raised.value.field == field


def test_memory_allowance_uses_the_smallest_device() -> None:
    assert memory_allowance_mib([_real(0, 40960), _real(1, 81920)], 500, 0) == 20480
    assert memory_allowance_mib([_real(0)], 500, 1234) == 1234
    assert memory_allowance_mib([], 0, 0) == 0


def test_describe_a_shared_gpu_without_mps() -> None:
    lines = describe_isolation([_real(0)], gpu_milli=300, gpu_mem_mib=0, watchdog=True)

    assert lines == [
        "CUDA_VISIBLE_DEVICES: enforced by the CUDA driver (1 device(s) by UUID)",
        "memory cap: advisory (frameworks read TESSERA_GPU_MEM_FRACTION / XLA_PYTHON_CLIENT_MEM_FRACTION); "
        "enforced after the fact by the NVML watchdog, which stops the workload",
        "compute share: not enforced without MPS (time-sliced with the GPU's other workloads)",
    ]


def test_describe_says_what_mps_mig_whole_gpus_cpu_and_simulation_enforce() -> None:
    mps = describe_isolation([_real(0)], 300, 0, mps=True)
    no_watchdog = describe_isolation([_real(0)], 300, 0)
    mig = describe_isolation([_real(0, 9728, mig_parent="GPU-0")], 1000, 0)

    assert "memory cap: enforced by MPS (CUDA_MPS_PINNED_DEVICE_MEM_LIMIT)" in mps
    assert any(line.startswith("compute share: enforced by MPS") for line in mps)
    assert any(line.endswith("not enforced (no watchdog on this node)") for line in no_watchdog)
    assert mig[-1] == "memory and compute: enforced by MIG hardware partitioning"
    assert describe_isolation([_real(0)], 1000, 0)[-1].startswith("memory and compute: whole GPU(s)")
    assert describe_isolation([], 0, 0) == [
        "CUDA_VISIBLE_DEVICES: enforced by the CUDA driver (empty: the workload sees no GPU)"
    ]
    assert describe_isolation(parse_gpu_spec("T4"), 500, 0)[0].startswith("simulated GPU: nothing enforced")


def test_a_named_pipe_alone_is_not_a_daemon(tmp_path: os.PathLike[str]) -> None:
    """Older daemons used a FIFO: only one that the daemon holds open (a reader) counts."""
    pipe_dir = os.fspath(tmp_path)
    assert not mps_available(pipe_dir)
    control = os.path.join(pipe_dir, "control")
    os.mkfifo(control)

    assert not mps_available(pipe_dir)  # left behind, nobody reading

    reader = os.open(control, os.O_RDONLY | os.O_NONBLOCK)
    try:
        assert mps_available(pipe_dir)
    finally:
        os.close(reader)


def test_a_stale_socket_is_not_a_daemon(tmp_path: os.PathLike[str]) -> None:
    """What a daemon leaves after ``quit``: the socket file, with nobody accepting on it."""
    path = os.path.join(os.fspath(tmp_path), "control")
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as server:
        server.bind(path)
        server.listen(1)
        assert mps_available(os.fspath(tmp_path))
    assert os.path.exists(path)

    assert not mps_available(os.fspath(tmp_path))


MPS_CONTROL = shutil.which("nvidia-cuda-mps-control")


@pytest.mark.skipif(
    MPS_CONTROL is None, reason="nvidia-cuda-mps-control is not installed (Debian non-free nvidia-cuda-mps)"
)
def test_the_real_mps_control_daemon_is_detected_while_it_runs_and_not_after_quit(tmp_path: Path) -> None:
    """The real daemon starts without a GPU; it creates a UNIX socket called ``control`` (not a FIFO) and leaves it
    behind when told to quit."""
    assert MPS_CONTROL is not None
    pipes, logs = tmp_path / "pipes", tmp_path / "logs"
    pipes.mkdir()
    logs.mkdir()
    env = {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(pipes), "CUDA_MPS_LOG_DIRECTORY": str(logs)}
    assert not mps_available(pipes)

    subprocess.run([MPS_CONTROL, "-d"], env=env, check=True, timeout=10)
    try:
        assert _wait_for(lambda: mps_available(pipes)), "the daemon never accepted a connection"
        assert stat.S_ISSOCK((pipes / "control").stat().st_mode)
    finally:
        subprocess.run([MPS_CONTROL], input=b"quit\n", env=env, timeout=10)

    assert _wait_for(lambda: not mps_available(pipes)), "a daemon that quit still reads as live"
    assert (pipes / "control").exists()  # the stale socket that fooled the old check


def _wait_for(condition: Callable[[], bool], timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return False
