"""The live model cache (``server.model_cache``): tiers measured from the page cache, the warm budget kept by
priority then recency, starts counted by the tier they began from; the weights read as the model's tenant (as
root, with a real tenant OS user: a path the tenant may not read is not read), never on the controller's thread,
and within bounds whatever path a tenant names. Real files, a fake clock, file work run inline unless said."""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from tessera.backends.accounts import Account, TenantAccounts, user_name
from tessera.server.as_tenant import as_account
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


def model(
    model_id: int, name: str, path: Path | None, slo: str = "standard", engine: str = "vllm", tenant: str = "team-a"
) -> DeployedModel:
    return DeployedModel(
        id=model_id, name=name, tenant=tenant, queue=tenant, engine=engine, weights=str(path or ""), gpus=1,
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


# ------------------------------------------------------------------------------- as the tenant, within bounds


@pytest.fixture
def tenant() -> Iterator[tuple[str, TenantAccounts, Path]]:
    """A tenant with its own OS user (root only), and a folder under /tmp (tenant users cannot reach pytest's)."""
    if os.geteuid() != 0:
        pytest.skip("reading as a tenant needs root and tenant users")
    base = Path("/tmp") / f"tessera-cache-{uuid.uuid4().hex[:8]}"
    base.mkdir(mode=0o755)
    accounts = TenantAccounts(base / "homes")
    accounts.check()
    name = f"t{uuid.uuid4().hex[:8]}"
    accounts.account(name)
    yield name, accounts, base
    subprocess.run(["userdel", user_name(name)], capture_output=True, check=False)
    shutil.rmtree(base, ignore_errors=True)


def test_weights_the_tenant_may_not_read_are_never_read_for_it(tenant: tuple[str, TenantAccounts, Path]) -> None:
    """Issue 25: the keeper ran as root on any path a tenant named and read it into the page cache (and told the
    tenant, by the tier, what was cached). As the tenant's user it gets EACCES: the model stays cold and the file's
    pages are not read in. The tenant's own readable weights are kept warm as before."""
    name, accounts, base = tenant
    private = weights(base / "root-only", 4 * MIB)
    private.chmod(0o700)  # root's: the tenant's user may not enter it
    readable = weights(base / "shared", 4 * MIB)
    for path in (private, readable):
        weights_cache.drop(path)
    keeper = ModelCacheKeeper(budget_bytes=64 * MIB, clock=lambda: 0.0, background=inline, account_of=accounts.account)
    secret = model(1, "secret", private, tenant=name)
    mine = model(2, "mine", readable, tenant=name)
    keeper.publish([secret, mine], {1: running(10), 2: running(20)})
    keeper.publish([secret, mine], {1: [], 2: []})
    assert keeper.tiers == {1: "cold", 2: "warm"}
    assert weights_cache.resident_fraction(private) < 0.1  # not read in for the tenant
    assert weights_cache.resident_fraction(readable) > 0.99
    assert keeper.state.warm.keys() == {mine.key}


def test_a_thread_as_the_tenant_reads_as_the_tenant_while_the_others_keep_root(
    tenant: tuple[str, TenantAccounts, Path],
) -> None:
    name, accounts, base = tenant
    secret = base / "secret"
    secret.write_text("root's")
    secret.chmod(0o600)
    account: Account = accounts.account(name)
    inside, outside = threading.Event(), threading.Event()
    seen: list[str] = []

    def as_tenant() -> None:
        with as_account(account):
            try:
                secret.read_text()
                seen.append("read")
            except PermissionError:
                seen.append("denied")
            inside.set()
            outside.wait(10)
        seen.append(secret.read_text())  # root's powers are back once the block ends

    worker = threading.Thread(target=as_tenant)
    worker.start()
    assert inside.wait(10)
    assert secret.read_text() == "root's"  # this thread kept root's powers meanwhile
    outside.set()
    worker.join(10)
    assert seen == ["denied", "root's"]


def test_the_file_work_never_runs_on_the_publishing_thread(tmp_path: Path) -> None:
    queued: list[Callable[[], object]] = []
    chat = model(1, "chat", weights(tmp_path / "chat", MIB))
    keeper = ModelCacheKeeper(budget_bytes=64 * MIB, clock=lambda: 0.0, background=queued.append)
    keeper.publish([chat], {1: running(10)})
    keeper.publish([chat], {1: []})
    assert keeper.tiers[1] == "cold" and len(queued) == 1  # not measured yet: cold until it is
    keeper.publish([chat], {1: []})
    assert len(queued) == 1  # nothing piles up behind work not done yet
    queued.pop()()
    assert keeper.tiers[1] == "warm"


def test_a_path_of_the_host_or_a_huge_sparse_file_costs_no_walk_and_no_measurement(tmp_path: Path) -> None:
    """``"model": "/"`` would have walked the host; a 512 GiB sparse file cost +384 MiB RSS and 1.5 s of CPU per
    measurement (a mincore vector of its whole size). Both are refused before any residency work, as is a folder of
    more entries than weights ever have; the keeper shows them cold."""
    with pytest.raises(weights_cache.NotWeights, match="not a model's weights"):
        weights_cache.scan("/")
    with pytest.raises(weights_cache.NotWeights):
        weights_cache.scan("/proc/self")
    sparse = tmp_path / "sparse"
    sparse.mkdir()
    with open(sparse / "model.safetensors", "wb") as handle:
        handle.truncate(512 << 30)
    with pytest.raises(weights_cache.NotWeights, match="sparse"):
        weights_cache.resident_fraction(sparse)
    crowded = tmp_path / "crowded"
    crowded.mkdir()
    for i in range(weights_cache.MAX_ENTRIES + 1):  # entries that are no files (files stop at MAX_FILES first)
        (crowded / str(i)).mkdir()
    with pytest.raises(weights_cache.NotWeights, match="entries"):
        weights_cache.scan(crowded)
    keeper = ModelCacheKeeper(budget_bytes=64 * MIB, clock=lambda: 0.0, background=inline)
    models = [model(1, "root", Path("/")), model(2, "sparse", sparse), model(3, "crowded", crowded)]
    keeper.publish(models, {1: running(10), 2: running(20), 3: running(30)})
    keeper.publish(models, {1: [], 2: [], 3: []})
    assert keeper.tiers == {1: "cold", 2: "cold", 3: "cold"} and keeper.state.used_bytes == 0


def test_residency_is_measured_in_windows_and_sampled_past_the_cap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = weights(tmp_path / "m", 8 * MIB)
    file = folder / "model.safetensors"
    weights_cache.drop(folder)
    with open(file, "rb") as handle:  # the first half in the page cache (no read-ahead past it)
        os.posix_fadvise(handle.fileno(), 0, 0, os.POSIX_FADV_RANDOM)
        handle.read(4 * MIB)
    monkeypatch.setattr(weights_cache, "WINDOW_BYTES", 256 * 1024)  # 32 windows
    assert weights_cache.resident_fraction(folder) == pytest.approx(0.5, abs=0.05)
    monkeypatch.setattr(weights_cache, "MAX_MEASURED_BYTES", 2 * MIB)  # 8 windows spread over the file
    assert weights_cache.resident_fraction(folder) == pytest.approx(0.5, abs=0.15)
    assert weights_cache.resident_bytes(file, [(0, MIB)]) == MIB  # a range of the file, the first MiB
