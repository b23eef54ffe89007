"""What ``tessera up`` tells a new user at start: the admin token once, and on a later start of the same store how
to get one (before, nothing: the README's next step needed a token the user could not find); and that a host with
mixed GPU models is split into one node per model with a share of its CPUs and memory (before, silently)."""

from __future__ import annotations

from tessera.gpu.gpus import SimulatedProbe, parse_gpu_spec
from tessera.server.pool import HostResources, Pool
from tessera.server.up import admin_token_notice

HOST = HostResources(cpu_milli=12_000, mem_mib=96 * 1024)


def test_the_admin_token_is_shown_once_and_later_starts_say_how_to_get_one() -> None:
    assert admin_token_notice("tsr_secret", None) == "admin token (shown once, stored hashed): tsr_secret"
    later = admin_token_notice(None, None)
    assert later is not None and "TESSERA_ADMIN_TOKEN" in later and "--admin-token-file" in later
    assert admin_token_notice(None, "given-by-the-operator") is None  # the operator knows it


def test_a_mixed_pool_says_how_the_host_is_split() -> None:
    mixed = Pool.from_devices(SimulatedProbe(parse_gpu_spec("4xA100-80GB,2xT4")).devices(), HOST)
    notice = mixed.split_notice()
    assert notice is not None
    assert "local/A100-80GB (4 GPU, 8 CPUs, 65536 MiB)" in notice and "local/T4 (2 GPU, 4 CPUs, 32768 MiB)" in notice
    single = Pool.from_devices(SimulatedProbe(parse_gpu_spec("2xA100-80GB")).devices(), HOST)
    assert single.split_notice() is None
