"""The live model cache (``server.model_cache``): tiers measured from the page cache, the warm budget kept by
priority then recency, starts counted by the tier they began from. Real files, a fake clock, file work run inline."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from tessera.server.model_cache import ModelCacheKeeper
from tessera.serving import weights_cache
from tessera.serving.controller import ReplicaView
from tessera.serving.replicas import DeployedModel

MIB = 1 << 20


def weights(folder: Path, size: int) -> Path:
    folder.mkdir(parents=True)
    with open(folder / "model.safetensors", "wb") as handle:
        handle.write(os.urandom(size))
        handle.flush()
        os.fsync(handle.fileno())
    return folder


def model(model_id: int, name: str, path: Path | None, slo: str = "standard", engine: str = "vllm") -> DeployedModel:
    return DeployedModel(
        id=model_id, name=name, tenant="team-a", queue="team-a", engine=engine, weights=str(path or ""), gpus=1,
        gpu_milli=250, gpu_mem_mib=0, min_replicas=0, max_replicas=1, idle_timeout_s=5, slo=slo,
    )  # fmt: skip


def running(workload_id: int) -> list[ReplicaView]:
    return [ReplicaView(workload_id, running=True, address=f"http://127.0.0.1:{9000 + workload_id}")]


def inline(work: Callable[[], object]) -> object:
    return work()


@pytest.fixture(autouse=True)
def dropping_works(tmp_path: Path) -> None:
    probe = weights(tmp_path / "probe", MIB)
    weights_cache.drop(probe)
    if weights_cache.resident_fraction(probe) > 0.5:
        pytest.skip("this filesystem keeps the pages despite POSIX_FADV_DONTNEED")


def test_a_model_is_hot_with_a_replica_then_warm_at_zero_with_its_weights_cached(tmp_path: Path) -> None:
    chat = model(1, "chat", weights(tmp_path / "chat", 4 * MIB))
    keeper = ModelCacheKeeper(budget_bytes=64 * MIB, clock=lambda: 0.0, background=inline)
    keeper.publish([chat], {1: running(10)})
    assert keeper.tiers[1] == "hot"
    weights_cache.drop(tmp_path / "chat")  # as if the kernel had reclaimed them while the engine ran
    keeper.publish([chat], {1: []})
    assert keeper.tiers[1] == "warm"  # read back in when it scaled to zero
    assert weights_cache.resident_fraction(tmp_path / "chat") > 0.99
    keeper.publish([chat], {1: running(11)})
    assert keeper.starts == {("chat", "cold"): 1, ("chat", "warm"): 1}


def test_the_budget_evicts_a_lower_priority_warm_model_and_never_a_higher_one(tmp_path: Path) -> None:
    clock = [0.0]
    keeper = ModelCacheKeeper(budget_bytes=6 * MIB, clock=lambda: clock[0], background=inline)
    batch = model(1, "batch", weights(tmp_path / "batch", 4 * MIB), slo="batch")
    chat = model(2, "chat", weights(tmp_path / "chat", 4 * MIB), slo="interactive")
    late = model(3, "late", weights(tmp_path / "late", 4 * MIB), slo="batch")
    everyone = [batch, chat, late]
    keeper.publish(everyone, {1: running(10), 2: running(20), 3: running(30)})
    keeper.publish(everyone, {1: [], 2: running(20), 3: running(30)})
    assert keeper.tiers[1] == "warm"
    clock[0] = 1.0
    keeper.publish(everyone, {1: [], 2: [], 3: running(30)})  # the interactive model needs the room
    assert (keeper.tiers[1], keeper.tiers[2]) == ("cold", "warm")
    assert weights_cache.resident_fraction(tmp_path / "batch") < 0.1  # its pages were let go
    clock[0] = 2.0
    keeper.publish(everyone, {1: [], 2: [], 3: []})  # a batch model may not push the interactive one out
    assert (keeper.tiers[2], keeper.tiers[3]) == ("warm", "cold")
    assert weights_cache.resident_fraction(tmp_path / "late") < 0.1


def test_a_model_without_weight_files_is_cold_at_zero_and_metrics_show_the_tiers(tmp_path: Path) -> None:
    sim = model(1, "demo", None, engine="sim")
    keeper = ModelCacheKeeper(budget_bytes=MIB, clock=lambda: 0.0, background=inline)
    keeper.publish([sim], {1: running(10)})
    keeper.publish([sim], {1: []})
    assert keeper.tiers[1] == "cold"
    registry = CollectorRegistry()
    registry.register(keeper.collector())
    text = generate_latest(registry).decode()
    assert 'tessera_model_cache_tier{served_model="demo",tier="cold"} 1.0' in text
    assert 'tessera_model_cache_tier{served_model="demo",tier="hot"} 0.0' in text
    assert 'tessera_model_starts_total{served_model="demo",tier="cold"} 1.0' in text
    assert "tessera_model_cache_budget_bytes 1.048576e+06" in text
    keeper.publish([], {})
    assert keeper.tiers == {}
