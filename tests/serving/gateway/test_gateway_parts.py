"""The gateway's parts on their own: the hold area, keys, the registry, the replica views the router sees."""

from __future__ import annotations

import asyncio
import gc

import pytest

from tessera.serving.engines.base import EngineStats
from tessera.serving.gateway.app import Gateway, GatewayConfig
from tessera.serving.gateway.auth import ANY_TENANT, OpenAccess, StaticKeys, visible
from tessera.serving.gateway.forward import DisconnectWatch, Message
from tessera.serving.gateway.hold import HoldArea, HoldExpired, HoldOverflow
from tessera.serving.gateway.registry import InMemoryRegistry, ModelRoute, ReplicaEndpoint
from tessera.serving.gateway.replicas import LiveReplicas, ReplicaLoad, prefix_hashes
from tessera.serving.policies.requests import InferenceRequest, SloClass


def _request(rid: int, slo: SloClass = SloClass.STANDARD, model: str = "m") -> InferenceRequest:
    return InferenceRequest(rid, model, 0.0, 10, 5, slo=slo, deadline_s=float(rid))


def test_held_requests_go_in_priority_order_and_a_cancelled_one_leaves_the_queue() -> None:
    async def go() -> None:
        area: HoldArea[str] = HoldArea(max_hold_s=60.0, max_held_per_model=10)
        order: list[int] = []

        async def wait(request: InferenceRequest) -> None:
            await area.wait(request)
            order.append(request.id)

        batch = asyncio.ensure_future(wait(_request(1, SloClass.BATCH)))
        urgent = asyncio.ensure_future(wait(_request(2, SloClass.INTERACTIVE)))
        gone = asyncio.ensure_future(wait(_request(3)))
        await asyncio.sleep(0)
        assert area.held("m") == 3
        gone.cancel()
        await asyncio.sleep(0)
        assert area.held("m") == 2  # withdrawn: it no longer counts against the bound
        assert area.release("m") == 2
        await asyncio.gather(batch, urgent)
        assert order == [2, 1]

    asyncio.run(go())


def test_the_hold_bound_and_the_wait_bound() -> None:
    async def go() -> None:
        area: HoldArea[str] = HoldArea(max_hold_s=0.05, max_held_per_model=1)
        first = asyncio.ensure_future(area.wait(_request(1)))
        await asyncio.sleep(0)
        with pytest.raises(HoldOverflow):
            await area.wait(_request(2))
        other_model = asyncio.ensure_future(area.wait(_request(3, model="other")))  # bounds are per model
        with pytest.raises(HoldExpired, match="held"):
            await first
        with pytest.raises(HoldExpired):
            await other_model
        assert area.total() == 0

    asyncio.run(go())


def test_held_requests_are_taken_most_urgent_first_one_at_a_time_and_a_binding_reaches_its_waiter() -> None:
    async def go() -> None:
        undone: list[tuple[int, str]] = []
        area: HoldArea[str] = HoldArea(60.0, 10, abandoned=lambda held, bound: undone.append((held.request.id, bound)))
        waits = {
            rid: asyncio.ensure_future(area.wait(_request(rid, slo)))
            for rid, slo in [(1, SloClass.BATCH), (2, SloClass.INTERACTIVE), (3, SloClass.STANDARD)]
        }
        await asyncio.sleep(0)
        first = area.pop_urgent("m")
        assert first is not None and first.request.id == 2
        area.put_back(first)  # nothing took it: it keeps its turn
        again = area.pop_urgent("m")
        assert again is first and area.held("m") == 3
        area.bind(again, "replica-a")
        assert await waits[2] == "replica-a" and area.held("m") == 2
        nxt = area.pop_urgent("m")
        assert nxt is not None and nxt.request.id == 3
        area.bind(nxt, "replica-b")
        waits[3].cancel()  # bound, then its client left before it could go: the binding is handed back
        with pytest.raises(asyncio.CancelledError):
            await waits[3]
        assert undone == [(3, "replica-b")]
        assert area.release("m") == 1 and await waits[1] is None  # let go unbound: it looks again
        assert area.total() == 0 and area.pop_urgent("m") is None

    asyncio.run(go())


def test_a_held_request_expires_at_its_own_deadline_and_withdrawn_ones_do_not_pile_up() -> None:
    async def go() -> None:
        area: HoldArea[str] = HoldArea(60.0, 10_000)
        loop = asyncio.get_running_loop()
        late = asyncio.ensure_future(area.wait(_request(1), expires_s=loop.time() + 0.02))  # a retry's deadline
        with pytest.raises(HoldExpired, match="held"):
            await late
        for rid in range(2, 1002):  # held and withdrawn: the heaps are compacted, not left to grow
            task = asyncio.ensure_future(area.wait(_request(rid)))
            await asyncio.sleep(0)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        assert area.total() == 0 and len(area._expiries) < 200

    asyncio.run(go())


def test_static_keys_name_tenants_and_tenants_see_their_own_models() -> None:
    keys = StaticKeys({"k1": "a", "k2": "b"})
    assert (keys.tenant("k1"), keys.tenant("k2"), keys.tenant("k3"), keys.tenant(None), keys.tenant("")) == (
        "a",
        "b",
        None,
        None,
        None,
    )
    route = ModelRoute("m", "a")
    assert visible(route, "a") and not visible(route, "b") and visible(route, ANY_TENANT)
    assert OpenAccess().tenant(None) == ANY_TENANT


def test_the_registry_tells_listeners_what_changed() -> None:
    registry = InMemoryRegistry()
    changed: list[str] = []
    registry.subscribe(changed.append)
    registry.deploy(ModelRoute("m", "a"))
    rid = registry.add_replica("m", "http://127.0.0.1:1")
    assert registry.replicas("m") == [ReplicaEndpoint(rid, "http://127.0.0.1:1")]
    registry.remove_replica("m", rid)
    registry.remove_replica("m", rid)  # already gone: no news
    assert changed == ["m", "m", "m"] and not registry.replicas("m")
    with pytest.raises(KeyError):
        registry.add_replica("nope", "http://127.0.0.1:1")


def test_a_replica_view_merges_the_scrape_with_the_gateways_own_in_flight_counts() -> None:
    load = ReplicaLoad(ReplicaEndpoint(3, "u"), EngineStats(running=4, waiting=1, kv_cache_usage=0.25))
    load.inflight_at_scrape = 2  # the engine had 5 requests at the scrape, 2 of them ours: 3 from elsewhere
    load.inflight, load.inflight_tokens, load.inflight_prompt_tokens = 6, 900, 300
    view = load.view()
    assert (view.replica, view.queued, view.running, view.predicted_tokens) == (3, 1, 8, 900)
    assert (view.kv_free_frac, view.prefill_tokens, view.accepting) == (0.75, 300, True)
    assert not ReplicaLoad(ReplicaEndpoint(0, "u"), EngineStats(sleeping=True)).view().accepting


def test_loads_follow_the_registry_and_keep_their_counts() -> None:
    registry = InMemoryRegistry()
    registry.deploy(ModelRoute("m", "a"))
    replicas = LiveReplicas(registry)
    assert replicas.pick(_request(0), "least-load", 0.0) is None
    first = registry.add_replica("m", "http://127.0.0.1:1")
    load = replicas.pick(_request(1), "least-load", 0.0)
    assert load is not None and load.endpoint.replica == first
    load.inflight = 4
    second = registry.add_replica("m", "http://127.0.0.1:2")
    picked = replicas.pick(_request(2), "least-load", 0.0)
    assert picked is not None and picked.endpoint.replica == second
    assert [x.inflight for x in replicas.loads("m")] == [4, 0]  # the first kept its count
    registry.remove_replica("m", second)
    assert [x.endpoint.replica for x in replicas.loads("m")] == [first]


def test_a_replica_at_its_cap_or_avoided_by_the_request_is_not_picked() -> None:
    registry = InMemoryRegistry()
    registry.deploy(ModelRoute("m", "a"))
    replicas = LiveReplicas(registry)
    first = registry.add_replica("m", "http://127.0.0.1:1")
    second = registry.add_replica("m", "http://127.0.0.1:2")
    loads = replicas.loads("m")
    loads[0].inflight, loads[1].inflight = 0, 2
    assert replicas.pick(_request(1), "least-load", 0.0, cap=2) is loads[0]
    loads[0].inflight = 2
    assert replicas.pick(_request(2), "least-load", 0.0, cap=2) is None and not replicas.any_takes("m", 0.0, 2)
    assert replicas.pick(_request(3), "least-load", 0.0) is not None  # no cap: both take requests
    picked = replicas.pick(_request(4), "least-load", 0.0, avoid=frozenset({first}))
    assert picked is not None and picked.endpoint.replica == second
    assert replicas.pick(_request(5), "least-load", 0.0, avoid=frozenset({first, second})) is None


def test_prefix_hashes_are_chained_over_whole_blocks() -> None:
    a = prefix_hashes("x" * 64 * 3 + "tail")
    b = prefix_hashes("x" * 64 * 2 + "y" * 64)
    assert len(a) == 3 and a[:2] == b[:2] and a[2] != b[2]
    assert prefix_hashes("short") == ()


def test_a_watch_closed_after_the_answer_ends_by_itself_and_leaves_no_cyclic_garbage() -> None:
    """ASGI's receive says http.disconnect once the answer is complete: the watcher returns then, uncancelled.
    A cancelled watcher would leave a reference cycle per request (its CancelledError's traceback holds its
    frames), which only the cyclic collector frees: the gateway's p99 stalls at 1,000 requests/s."""

    async def go() -> tuple[bool, bool, int]:
        complete = asyncio.Event()

        async def receive() -> Message:
            await complete.wait()
            return {"type": "http.disconnect"}

        async def answer() -> asyncio.Task[None]:
            task = asyncio.current_task()
            assert task is not None
            watch = DisconnectWatch(receive, task)
            watch.finishing()
            complete.set()  # the server wakes receive as the answer's end goes out
            watch.close()
            return watch._watcher

        gc.collect()
        gc.disable()
        try:
            watcher = await asyncio.ensure_future(answer())
            await asyncio.sleep(0)
            await asyncio.sleep(0)
            done, cancelled = watcher.done(), watcher.cancelled()
            del watcher
            return done, cancelled, gc.collect()
        finally:
            gc.enable()

    done, cancelled, unreachable = asyncio.run(go())
    assert done and not cancelled
    assert unreachable == 0


def test_a_watch_closed_before_any_answer_is_cancelled() -> None:
    async def go() -> bool:
        async def receive() -> Message:
            await asyncio.Event().wait()  # the client neither leaves nor gets an answer
            return {"type": "http.disconnect"}

        task = asyncio.current_task()
        assert task is not None
        watch = DisconnectWatch(receive, task)
        await asyncio.sleep(0)
        watch.close()
        await asyncio.sleep(0)
        return watch._watcher.cancelled()

    assert asyncio.run(go())


def test_a_gateway_that_owns_its_process_freezes_the_start_up_heap_once_started() -> None:
    async def go(freeze: bool) -> int:
        config = GatewayConfig(scrape_interval_s=3600, freeze_heap_on_start=freeze)
        gateway = Gateway(InMemoryRegistry(), config=config)
        await gateway.start()
        try:
            return gc.get_freeze_count()
        finally:
            await gateway.close()
            gc.unfreeze()

    assert asyncio.run(go(False)) == 0
    assert asyncio.run(go(True)) > 1000  # the imports' objects at least


def test_late_binding_by_kv_room_counts_the_engines_use_and_the_prompts_sent_since() -> None:
    """The twin's has_room on what the gateway knows: a replica with 10,000 KV tokens, 60% used at its last scrape,
    holds a 1,000-token prompt and a typical answer beside them; not once 2,000 more prompt tokens went there since
    the scrape; an idle replica always takes one; an engine that exports no KV size is not held back."""
    load = ReplicaLoad(ReplicaEndpoint(0, "u"), EngineStats(kv_cache_usage=0.6, kv_capacity_tokens=10_000))
    load.inflight, load.inflight_prompt_tokens = 3, 3_000
    load.prompt_tokens_at_scrape = 3_000
    need = 1_000 + 256
    assert load.takes(0.0, 32, need)  # 4,000 free
    load.inflight, load.inflight_prompt_tokens = 5, 5_000  # two prompts sent since the scrape: 2,000 free
    assert load.has_room(need) and not load.has_room(2_100)
    load.inflight_prompt_tokens = 6_000  # 1,000 free
    assert not load.takes(0.0, 32, need) and load.takes(0.0, 32, 0)  # no KV room asked: the count cap alone
    load.inflight = 0
    assert load.takes(0.0, 32, need)  # idle: whatever its last scrape said
    blind = ReplicaLoad(ReplicaEndpoint(1, "u"), EngineStats(kv_cache_usage=0.99))
    blind.inflight = 5
    assert blind.takes(0.0, 32, need)
