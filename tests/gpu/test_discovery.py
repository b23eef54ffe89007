"""detect_gpus: NVML when it works, the documented simulated pool when it does not, a spec when given one."""

import logging

import pytest

from tessera.core.errors import InvalidRequestError
from tessera.gpu.discovery import DEFAULT_SIMULATED_SPEC, detect_gpus
from tessera.gpu.fakes import FakeGpu, FakeNvml
from tessera.gpu.nvml import NvmlProbe


def _no_driver() -> FakeNvml:
    raise OSError("NVML Shared Library Not Found")


def test_auto_falls_back_to_a_simulated_pool_when_nvml_fails(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="tessera.gpu.discovery"):
        probe = detect_gpus("auto", nvml_loader=_no_driver)

    devices = probe.devices()
    assert DEFAULT_SIMULATED_SPEC == "1xA100-80GB"
    assert [(d.model, d.simulated) for d in devices] == [("A100-80GB", True)]
    assert "SIMULATED" in caplog.text and "NVML Shared Library Not Found" in caplog.text


def test_auto_falls_back_when_init_fails_or_no_gpu_is_present() -> None:
    def failing_init() -> FakeNvml:
        nvml = FakeNvml([], init_error="Driver Not Loaded")
        nvml.nvmlInit()
        return nvml

    empty = FakeNvml([])
    assert detect_gpus("auto", nvml_loader=failing_init).devices()[0].simulated
    assert detect_gpus("AUTO", nvml_loader=lambda: empty).devices()[0].simulated


def test_auto_uses_nvml_when_it_finds_gpus() -> None:
    nvml = FakeNvml([FakeGpu("NVIDIA H100 80GB HBM3", 81559, "GPU-h100")])

    probe = detect_gpus("auto", nvml_loader=lambda: nvml, node="n1")

    assert isinstance(probe, NvmlProbe)
    assert [(d.uuid, d.model, d.node, d.simulated) for d in probe.devices()] == [("GPU-h100", "H100-80GB", "n1", False)]


def test_any_other_spec_is_a_simulated_pool_and_nvml_is_not_touched() -> None:
    def must_not_load() -> FakeNvml:
        raise AssertionError("NVML loaded for an explicit pool")

    probe = detect_gpus("2xT4", nvml_loader=must_not_load)

    assert [d.model for d in probe.devices()] == ["T4", "T4"]


def test_a_bad_spec_is_an_error_not_a_fallback() -> None:
    with pytest.raises(InvalidRequestError, match="gpus"):
        detect_gpus("3xNOPE")
