"""The DCGM-compatible collector's exposition, read back through prometheus_client."""

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tessera.gpu.dcgm import GpuUsageCollector
from tessera.gpu.fakes import FakeGpu, FakeNvml
from tessera.gpu.gpus import GpuDevice, GpuUsage, SimulatedProbe, parse_gpu_spec
from tessera.gpu.nvml import NvmlProbe


def _scrape(collector: GpuUsageCollector) -> dict[str, list[tuple[dict[str, str], float]]]:
    registry = CollectorRegistry()
    registry.register(collector)
    text = generate_latest(registry).decode()
    return {
        family.name: [(sample.labels, sample.value) for sample in family.samples]
        for family in text_string_to_metric_families(text)
    }


def test_usage_is_exported_under_dcgm_names_units_and_labels() -> None:
    nvml = FakeNvml(
        [
            FakeGpu("NVIDIA H100 80GB HBM3", 81559, "GPU-aaa", mem_used_mib=1559, util_pct=87, power_mw=312_250),
            FakeGpu("Tesla T4", 15360, "GPU-bbb", mem_used_mib=0, util_pct=0, power_mw=9_000),
        ]
    )

    metrics = _scrape(GpuUsageCollector(NvmlProbe(nvml), hostname="node-1"))

    labels = {"gpu": "0", "UUID": "GPU-aaa", "device": "nvidia0", "modelName": "NVIDIA H100 80GB HBM3"}
    first = {**labels, "Hostname": "node-1"}
    assert metrics["DCGM_FI_DEV_GPU_UTIL"][0] == (first, 87.0)
    assert metrics["DCGM_FI_DEV_FB_USED"][0] == (first, 1559.0)
    assert metrics["DCGM_FI_DEV_FB_FREE"][0] == (first, 80000.0)
    assert metrics["DCGM_FI_DEV_POWER_USAGE"][0] == (first, 312.25)
    assert [s[0]["gpu"] for s in metrics["DCGM_FI_DEV_GPU_UTIL"]] == ["0", "1"]
    assert metrics["DCGM_FI_DEV_GPU_UTIL"][1][0]["modelName"] == "Tesla T4"


def test_exposition_declares_gauges_with_help() -> None:
    nvml = FakeNvml([FakeGpu("Tesla T4", 15360, "GPU-t4")])
    registry = CollectorRegistry()
    registry.register(GpuUsageCollector(NvmlProbe(nvml), hostname="h"))

    text = generate_latest(registry).decode()

    assert "# TYPE DCGM_FI_DEV_GPU_UTIL gauge" in text
    assert "# HELP DCGM_FI_DEV_FB_USED Framebuffer memory used (in MiB)." in text


def test_unknown_utilisation_under_mig_is_left_out_not_zero() -> None:
    mig = [FakeGpu("NVIDIA A100-SXM4-80GB MIG 7g.80gb", 81000, "MIG-x")]
    nvml = FakeNvml([FakeGpu("NVIDIA A100-SXM4-80GB", 81920, "GPU-m", mig=mig, mig_enabled=True, power_mw=60_000)])

    metrics = _scrape(GpuUsageCollector(NvmlProbe(nvml), hostname="h"))

    assert metrics["DCGM_FI_DEV_GPU_UTIL"] == []
    assert metrics["DCGM_FI_DEV_POWER_USAGE"][0][1] == 60.0


def test_a_simulated_pool_exports_nothing() -> None:
    metrics = _scrape(GpuUsageCollector(SimulatedProbe(parse_gpu_spec("2xA100-80GB")), hostname="h"))

    assert metrics == {}


def test_simulated_samples_are_dropped_even_from_a_probe_that_reports_them() -> None:
    device = GpuDevice(0, "SIM-local-T4-0", "T4", 16384, simulated=True)

    class Chatty:
        def devices(self) -> list[GpuDevice]:
            return [device]

        def usage(self) -> list[GpuUsage]:
            return [GpuUsage(device.uuid, 50.0, 1, 16384, 70.0)]

    assert _scrape(GpuUsageCollector(Chatty(), hostname="h")) == {}


def test_a_failing_probe_yields_an_empty_scrape_not_an_error() -> None:
    class Broken(SimulatedProbe):
        def usage(self) -> list[GpuUsage]:
            raise RuntimeError("NVML went away")

    assert _scrape(GpuUsageCollector(Broken([]), hostname="h")) == {}


def test_registration_does_not_sample() -> None:
    class Counting(SimulatedProbe):
        calls = 0

        def usage(self) -> list[GpuUsage]:
            Counting.calls += 1
            return []

    registry = CollectorRegistry(auto_describe=True)
    registry.register(GpuUsageCollector(Counting([]), hostname="h"))

    assert Counting.calls == 0
