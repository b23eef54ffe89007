"""NvmlProbe against the fake NVML: catalog mapping of driver names, MIG listing, usage units, guards."""

import logging
import math
from typing import Any

import pytest

from tessera.gpu.fakes import FakeGpu, FakeNvml
from tessera.gpu.nvml import NvmlApi, NvmlProbe, match_catalog_model


@pytest.mark.parametrize(
    ("nvml_name", "mem_mib", "model"),
    [
        ("NVIDIA A100-SXM4-80GB", 81920, "A100-80GB"),
        ("NVIDIA A100-SXM4-40GB", 40960, "A100-40GB"),
        ("NVIDIA A100 80GB PCIe", 81920, "A100-80GB"),
        ("NVIDIA H100 80GB HBM3", 81559, "H100-80GB"),
        ("NVIDIA H100 PCIe", 81559, "H100-80GB"),
        ("NVIDIA H200", 143771, "H200"),
        ("Tesla T4", 15360, "T4"),
        ("Tesla V100-SXM2-16GB", 16160, "V100M16"),
        ("Tesla V100-SXM2-32GB", 32510, "V100M32"),
        ("Tesla P100-PCIE-16GB", 16280, "P100"),
        ("NVIDIA A10", 23028, "A10"),
        ("NVIDIA L4", 23034, "L4"),
        ("NVIDIA L40S", 46068, "L40S"),
        ("NVIDIA GeForce RTX 4090", 24564, "RTX4090"),
    ],
)
def test_driver_names_map_to_catalog_models(nvml_name: str, mem_mib: int, model: str) -> None:
    assert match_catalog_model(nvml_name, mem_mib) == model


def test_unknown_names_take_the_closest_model_by_memory_and_warn(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="tessera.gpu.nvml"):
        model = match_catalog_model("NVIDIA RTX A6000", 49140)

    assert model == "L40S"
    assert "not in the catalog" in caplog.text and "L40S" in caplog.text


def test_undisclosed_trace_models_are_never_guessed() -> None:
    assert match_catalog_model("Mystery GPU", 16 * 1024) not in {"G2", "G3"}


def _a100(uuid: str = "GPU-a100", **kwargs: Any) -> FakeGpu:
    return FakeGpu("NVIDIA A100-SXM4-80GB", 81920, uuid, **kwargs)


def test_whole_gpus_become_real_devices_in_nvml_order() -> None:
    nvml = FakeNvml([_a100("GPU-0"), FakeGpu("Tesla T4", 15360, "GPU-1")])

    devices = NvmlProbe(nvml, node="n7").devices()

    assert [(d.index, d.uuid, d.model, d.mem_mib) for d in devices] == [
        (0, "GPU-0", "A100-80GB", 81920),
        (1, "GPU-1", "T4", 15360),
    ]
    assert all(not d.simulated and d.node == "n7" and not d.is_mig for d in devices)
    assert devices[0].product_name == "NVIDIA A100-SXM4-80GB"


def test_a_mig_enabled_gpu_contributes_its_instances() -> None:
    instances = [
        FakeGpu("NVIDIA A100-SXM4-80GB MIG 3g.40gb", 40192, "MIG-aaa"),
        FakeGpu("NVIDIA A100-SXM4-80GB MIG 1g.10gb", 9728, "MIG-bbb"),
    ]
    nvml = FakeNvml([_a100("GPU-0", mig=instances, mig_enabled=True), _a100("GPU-1", mig=[], mig_enabled=False)])

    devices = NvmlProbe(nvml).devices()

    assert [(d.index, d.uuid, d.mem_mib, d.mig_parent_uuid) for d in devices] == [
        (0, "MIG-aaa", 40192, "GPU-0"),
        (1, "MIG-bbb", 9728, "GPU-0"),
        (2, "GPU-1", 81920, ""),
    ]
    assert devices[0].model == "A100-80GB" and devices[0].is_mig  # the model of the GPU it is carved from


def test_mig_enabled_without_instances_offers_nothing_and_warns(caplog: pytest.LogCaptureFixture) -> None:
    nvml = FakeNvml([_a100("GPU-0", mig=[], mig_enabled=True)])

    with caplog.at_level(logging.WARNING):
        assert NvmlProbe(nvml).devices() == []
    assert "no MIG instances" in caplog.text


def test_usage_converts_bytes_to_mib_and_milliwatts_to_watts() -> None:
    nvml = FakeNvml([_a100("GPU-0", mem_used_mib=2048, util_pct=37, power_mw=251_500)])

    (usage,) = NvmlProbe(nvml).usage()

    assert (usage.uuid, usage.gpu_index, usage.product_name) == ("GPU-0", 0, "NVIDIA A100-SXM4-80GB")
    assert (usage.util_pct, usage.mem_used_mib, usage.mem_total_mib, usage.power_w) == (37.0, 2048, 81920, 251.5)


def test_usage_of_a_mig_gpu_is_sampled_whole_with_unknown_utilisation() -> None:
    mig = [FakeGpu("NVIDIA A100-SXM4-80GB MIG 7g.80gb", 81000, "MIG-x")]
    nvml = FakeNvml([_a100("GPU-0", mig=mig, mig_enabled=True, power_mw=90_000)])

    (usage,) = NvmlProbe(nvml).usage()

    assert usage.uuid == "GPU-0" and math.isnan(usage.util_pct) and usage.power_w == 90.0


def test_process_memory_is_listed_per_schedulable_device() -> None:
    mig = [FakeGpu("NVIDIA A100-SXM4-80GB MIG 1g.10gb", 9728, "MIG-x", processes=[(42, 3000)])]
    nvml = FakeNvml([_a100("GPU-0", mig=mig, mig_enabled=True), _a100("GPU-1", processes=[(7, 1024), (8, 10)])])

    held = NvmlProbe(nvml).process_memory()

    assert [(p.pid, p.gpu_uuid, p.used_mib) for p in held] == [
        (42, "MIG-x", 3000),
        (7, "GPU-1", 1024),
        (8, "GPU-1", 10),
    ]


def test_bytes_names_from_old_pynvml_are_decoded() -> None:
    class BytesNvml(FakeNvml):
        def nvmlDeviceGetName(self, handle: FakeGpu) -> bytes:  # type: ignore[override]
            return handle.name.encode()

    (device,) = NvmlProbe(BytesNvml([FakeGpu("Tesla T4", 15360, "GPU-t4")])).devices()

    assert device.model == "T4" and device.product_name == "Tesla T4"


def test_the_nvml_functions_called_exist_in_pynvml() -> None:
    pynvml = pytest.importorskip("pynvml")
    called = [name for name in vars(NvmlApi) if name.startswith("nvml")]

    assert called and [name for name in called if not callable(getattr(pynvml, name, None))] == []
    assert issubclass(pynvml.NVMLError, Exception)
