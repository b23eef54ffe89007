"""The memory watchdog stops only the workload that holds more than its allowance."""

from tessera.gpu.fakes import FakeGpu, FakeNvml
from tessera.gpu.gpus import ProcessMemory
from tessera.gpu.nvml import NvmlProbe
from tessera.gpu.watchdog import Violation, Watchdog, detect_overuse


def test_only_workloads_over_allowance_plus_tolerance_are_reported() -> None:
    usage = [
        ProcessMemory(10, "GPU-0", 20_000),  # a: 20000 + 700 > 20000 + 512
        ProcessMemory(11, "GPU-0", 700),
        ProcessMemory(20, "GPU-0", 20_400),  # b: within the tolerance
        ProcessMemory(30, "GPU-0", 60_000),  # not a Tessera workload
    ]

    violations = detect_overuse(usage, {"a": 20_000, "b": 20_000}, {10: "a", 11: "a", 20: "b"})

    assert violations == [Violation("a", "GPU-0", 20_700, 20_000, (10, 11))]
    assert violations[0].reason == (
        "GPU memory 20700 MiB on GPU-0 exceeds its allowance of 20000 MiB + 512 MiB slack (processes 10, 11)"
    )


def test_each_gpu_is_judged_apart_and_uncapped_workloads_are_left_alone() -> None:
    usage = [ProcessMemory(1, "GPU-0", 900), ProcessMemory(1, "GPU-1", 900), ProcessMemory(2, "GPU-0", 99_999)]

    violations = detect_overuse(usage, {"a": 1000, "free": 0}, {1: "a", 2: "free"}, tolerance_mib=0)

    assert violations == []
    over = detect_overuse(usage, {"a": 800}, {1: "a"}, tolerance_mib=0)
    assert len(over) == 2
    assert "exceeds its allowance of 800 MiB (processes 1)" in over[0].reason  # no slack applied, none named


def test_check_once_kills_only_the_offender_once() -> None:
    nvml = FakeNvml(
        [
            FakeGpu("NVIDIA A100-SXM4-80GB", 81920, "GPU-0", processes=[(100, 30_000), (200, 10_000)]),
            FakeGpu("NVIDIA A100-SXM4-80GB", 81920, "GPU-1", processes=[(101, 30_000)]),
        ]
    )
    killed: list[tuple[str, str]] = []
    watchdog = Watchdog(NvmlProbe(nvml), kill=lambda workload, reason: killed.append((workload, reason)))

    violations = watchdog.check_once(
        {"greedy": 20_480, "polite": 20_480}, {100: "greedy", 101: "greedy", 200: "polite"}
    )

    assert [v.gpu_uuid for v in violations] == ["GPU-0", "GPU-1"]
    assert [workload for workload, _ in killed] == ["greedy"]
    assert "exceeds its allowance of 20480 MiB + 512 MiB slack" in killed[0][1]


def test_a_failed_kill_does_not_spare_the_next_offender() -> None:
    usage = [ProcessMemory(1, "GPU-0", 5000), ProcessMemory(2, "GPU-0", 5000)]

    class Probe:
        def process_memory(self) -> list[ProcessMemory]:
            return usage

    attempts: list[str] = []

    def kill(workload_id: str, reason: str) -> None:
        attempts.append(workload_id)
        if workload_id == "a":
            raise RuntimeError("process already gone")

    Watchdog(Probe(), kill=kill, tolerance_mib=0).check_once({"a": 1000, "b": 1000}, {1: "a", 2: "b"})

    assert attempts == ["a", "b"]
