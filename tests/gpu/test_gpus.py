"""Simulated pool specs: parsing, UUIDs and the errors a bad spec gets."""

import pytest

from tessera.core.errors import InvalidRequestError
from tessera.gpu.gpus import SimulatedProbe, parse_gpu_spec


def test_counts_models_and_indices_follow_the_spec() -> None:
    devices = parse_gpu_spec("4xA100-80GB,2xT4")

    assert [d.model for d in devices] == ["A100-80GB"] * 4 + ["T4"] * 2
    assert [d.index for d in devices] == list(range(6))
    assert devices[0].mem_mib == 80 * 1024 and devices[-1].mem_mib == 16 * 1024
    assert all(d.simulated and d.node == "local" and not d.is_mig for d in devices)


def test_count_defaults_to_one_and_names_are_case_insensitive() -> None:
    assert [d.model for d in parse_gpu_spec("a100-80gb")] == ["A100-80GB"]
    assert [d.model for d in parse_gpu_spec(" 2X h100 , t4 ")] == ["H100-80GB", "H100-80GB", "T4"]


def test_uuids_are_stable_unique_and_name_the_node() -> None:
    first = parse_gpu_spec("2xT4,A100-80GB", node="n1")
    again = parse_gpu_spec("2xT4,A100-80GB", node="n1")
    other_node = parse_gpu_spec("2xT4,A100-80GB", node="n2")

    assert [d.uuid for d in first] == ["SIM-n1-T4-0", "SIM-n1-T4-1", "SIM-n1-A100-80GB-2"]
    assert first == again
    assert not {d.uuid for d in first} & {d.uuid for d in other_node}


def test_node_names_cannot_break_a_comma_separated_device_list() -> None:
    (device,) = parse_gpu_spec("T4", node="rack 1,slot 2")

    assert "," not in device.uuid and " " not in device.uuid


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("", "empty GPU spec"),
        ("A100-80GB,,T4", "empty entry"),
        ("0xT4", "'0xT4': the count must be at least 1"),
        ("2xB9000", "unknown GPU model 'B9000'"),
        ("4xA100", "'A100' is a GPU family; name one model (A100-40GB, A100-80GB)"),
        ("300xT4", "at most 256 per node"),
    ],
)
def test_bad_specs_name_the_bad_part(spec: str, expected: str) -> None:
    with pytest.raises(InvalidRequestError) as raised:
        parse_gpu_spec(spec)

    assert raised.value.field == "gpus"
    assert expected in raised.value.message


def test_unknown_model_message_lists_the_known_models() -> None:
    with pytest.raises(InvalidRequestError, match=r"known: .*T4.*A100-80GB.*RTX4090"):
        parse_gpu_spec("2xT4,1xRTX9090")


def test_simulated_probe_reports_its_devices_and_no_usage() -> None:
    devices = parse_gpu_spec("2xL4")
    probe = SimulatedProbe(devices)

    assert probe.devices() == devices
    assert probe.usage() == []
    assert probe.process_memory() == []
