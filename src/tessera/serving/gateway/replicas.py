"""The replicas' live load and the routing decision: the part-1 router fed by scraped engine stats.

Each ready replica has a ``ReplicaLoad``: the last scrape of its ``/metrics`` (``engines.metrics``: vLLM's running
and waiting gauges, its KV-cache usage) and the gateway's own exact count of what it has in flight there (requests
and their predicted tokens), which is fresh between scrapes. ``ReplicaLoad.view`` merges the two into the part-1
``ReplicaView``; ``LiveReplicas.pick`` runs the model's router (``policies.router``, one ``RouterState`` per model)
over them, among the replicas that take a request now (``ReplicaLoad.takes``: awake, reachable, under the in-flight
cap given). ``scrape_once`` reads every replica's metrics (the gateway calls it each scrape interval); a replica
whose scrape fails keeps its last figures (the in-flight counts still move). The ``running`` a router sees is this
gateway's own in-flight count now plus the other requests the engine held at the last scrape.

A replica found asleep (vLLM's ``/sleep``, the sim's) is woken (``/wake_up``): Tessera never puts a live replica
to sleep, and a sleeping replica takes no requests, so one left asleep would hold its model's requests until they
time out.
"""

from __future__ import annotations

import asyncio
import logging
import zlib
from dataclasses import dataclass, field, replace

import numpy as np

from tessera.serving.engines.base import EngineStats
from tessera.serving.engines.metrics import parse_metrics
from tessera.serving.gateway.registry import ReplicaEndpoint, ReplicaRegistry
from tessera.serving.gateway.upstream import Upstream, UpstreamError
from tessera.serving.policies.requests import InferenceRequest
from tessera.serving.policies.router import ReplicaView, Router, RouterState, make_router
from tessera.serving.setups import ROOM_KV_FREE

log = logging.getLogger(__name__)

PREFIX_BLOCK_CHARS = 64  # ~16 tokens, the engines' KV block
MAX_PREFIX_BLOCKS = 64


@dataclass(slots=True)
class ReplicaLoad:
    endpoint: ReplicaEndpoint
    scraped: EngineStats = field(default_factory=EngineStats)
    inflight: int = 0  # requests this gateway sent there that have not finished
    inflight_tokens: int = 0  # their prompt + predicted output tokens
    inflight_prompt_tokens: int = 0
    inflight_at_scrape: int = 0  # ``inflight`` when the last scrape came back
    prompt_tokens_at_scrape: int = 0  # ``inflight_prompt_tokens`` then
    unreachable_until_s: float = 0.0  # loop time before which it gets no request (a connection to it failed)
    scrape_failures: int = 0  # in a row

    def takes(self, now_s: float, cap: int = 0, need_tokens: int = 0) -> bool:
        """Whether it may be sent a request now: awake, not left alone after a failed connection, (``cap`` > 0)
        fewer than ``cap`` of this gateway's requests in flight there, and (``need_tokens`` > 0) room in its KV
        cache (``has_room``)."""
        if self.scraped.sleeping or now_s < self.unreachable_until_s or (cap > 0 and self.inflight >= cap):
            return False
        return need_tokens <= 0 or self.has_room(need_tokens)

    def has_room(self, need_tokens: int) -> bool:
        """The twin's late-binding rule (``sim.serving.fleet.has_room``) on what the gateway knows: idle, or its KV
        cache (the engine's exported size) holds ``need_tokens`` more beside what it holds, with ``ROOM_KV_FREE`` of
        it to spare. What it holds: its KV cache use at the last scrape, plus the prompts sent there since (what an
        engine allocates when it admits a request; answers grow it by a block at a time, seen at the next scrape).
        An engine that exports no size: room."""
        capacity = self.scraped.kv_capacity_tokens
        if capacity <= 0 or self.inflight == 0:
            return True
        sent_since = max(0, self.inflight_prompt_tokens - self.prompt_tokens_at_scrape)
        free = capacity * (1.0 - self.scraped.kv_cache_usage) - sent_since
        return free >= need_tokens and free >= ROOM_KV_FREE * capacity

    def view(self, now_s: float = 0.0, cap: int = 0, need_tokens: int = 0) -> ReplicaView:
        """Its own requests counted now, others' as of the last scrape: the engine's requests then, less this
        gateway's then (taking the scraped counts alone would herd every request onto the replica that looked
        idlest until the next scrape). Accepting as ``takes`` says."""
        stats = self.scraped
        others = max(0, stats.running + stats.waiting - self.inflight_at_scrape)
        return ReplicaView(
            replica=self.endpoint.replica,
            queued=stats.waiting,
            running=max(0, self.inflight + others - stats.waiting),
            predicted_tokens=self.inflight_tokens,
            kv_free_frac=1.0 - stats.kv_cache_usage,
            accepting=self.takes(now_s, cap, need_tokens),
            prefill_tokens=self.inflight_prompt_tokens,
        )


@dataclass(slots=True)
class _ModelRouting:
    router: Router
    state: RouterState


def prefix_hashes(text: str) -> tuple[int, ...]:
    """Chained CRC-32 hashes of the prompt's leading blocks (what prefix-affinity routing matches on)."""
    hashes: list[int] = []
    chained = 0
    for start in range(0, min(len(text), PREFIX_BLOCK_CHARS * MAX_PREFIX_BLOCKS), PREFIX_BLOCK_CHARS):
        block = text[start : start + PREFIX_BLOCK_CHARS]
        if len(block) < PREFIX_BLOCK_CHARS:
            break
        chained = zlib.crc32(block.encode(), chained)
        hashes.append(chained)
    return tuple(hashes)


class LiveReplicas:
    """See the module docstring. Call it on the event loop thread only."""

    def __init__(self, registry: ReplicaRegistry, seed: int = 0, max_prefix_entries: int = 200_000) -> None:
        self.registry = registry
        self.max_prefix_entries = max_prefix_entries  # the cap of each model's prefix index (prefix-affinity)
        self._loads: dict[str, dict[int, ReplicaLoad]] = {}
        self._ready: dict[str, list[ReplicaLoad]] = {}  # loads(model) until the registry says the model changed
        self._routing: dict[str, _ModelRouting] = {}
        self._rng = np.random.default_rng(seed)
        registry.subscribe(self._changed)

    def _changed(self, model: str) -> None:
        self._ready.pop(model, None)

    def loads(self, model: str) -> list[ReplicaLoad]:
        """The ready replicas' loads, in the registry's order (new replicas join, gone ones leave, here). The list
        is kept until the registry reports a change of ``model``: callers must not change it."""
        ready = self._ready.get(model)
        if ready is not None:
            return ready
        endpoints = self.registry.replicas(model)
        known = self._loads.get(model)
        if known is None:
            known = self._loads[model] = {}
        if len(known) != len(endpoints) or any(e.replica not in known for e in endpoints):
            fresh = {e.replica: known.get(e.replica) or ReplicaLoad(e) for e in endpoints}
            known.clear()
            known.update(fresh)
        ready = self._ready[model] = list(known.values())
        return ready

    def pick(
        self, request: InferenceRequest, router_name: str, now_s: float, cap: int = 0,
        avoid: frozenset[int] = frozenset(), need_tokens: int = 0,
    ) -> ReplicaLoad | None:  # fmt: skip
        """The replica the model's router chooses among those that take a request now (``ReplicaLoad.takes`` with
        ``cap`` and ``need_tokens``) and are not in ``avoid`` (replica ids), or None when there is none."""
        loads = self.loads(request.model)
        if not loads:
            return None
        routing = self._routing.get(request.model)
        if routing is None or routing.router.name != router_name:
            router = make_router(router_name, max_prefix_entries=self.max_prefix_entries)
            routing = self._routing[request.model] = _ModelRouting(router, router.initial_state())
        views = [load.view(now_s, cap, need_tokens) for load in loads]
        if avoid:
            views = [replace(v, accepting=False) if v.replica in avoid else v for v in views]
        decision, _ = routing.router.route(request, views, routing.state, now_s, self._rng)
        if decision.replica is None:
            return None
        for load in loads:
            if load.endpoint.replica == decision.replica:
                return load
        return None

    def any_takes(self, model: str, now_s: float, cap: int = 0, need_tokens: int = 0) -> bool:
        """Whether some ready replica of ``model`` takes a request now (``ReplicaLoad.takes``)."""
        return any(load.takes(now_s, cap, need_tokens) for load in self.loads(model))

    def prefix_entries(self) -> int:
        """Entries in the prefix indexes of all models (each capped at ``max_prefix_entries``)."""
        return sum(len(r.state.prefix_index) for r in self._routing.values() if r.state.prefix_index is not None)

    def forget(self, model: str) -> None:
        """The model is gone: drop its loads and router state."""
        self._loads.pop(model, None)
        self._ready.pop(model, None)
        self._routing.pop(model, None)

    async def scrape_once(self, upstream: Upstream, timeout_s: float = 2.0) -> None:
        loads = [load for route in self.registry.routes() for load in self.loads(route.name)]
        await asyncio.gather(*(self._scrape(upstream, load, timeout_s) for load in loads))

    @staticmethod
    async def _scrape(upstream: Upstream, load: ReplicaLoad, timeout_s: float) -> None:
        endpoint = load.endpoint
        try:
            async with asyncio.timeout(timeout_s):
                status, body = await upstream.call(
                    "GET", endpoint.base_url, "/metrics", peer_pid=endpoint.peer_pid, api_key=endpoint.api_key
                )
                if status != 200:
                    raise UpstreamError(f"status {status}")
                load.scraped = parse_metrics(body.decode("utf-8", "replace"))
                if load.scraped.sleeping:  # asleep, and not by the gateway's doing: wake it
                    log.warning("replica %s asleep, not by Tessera's doing: waking it", endpoint.base_url)
                    await upstream.call(
                        "POST", endpoint.base_url, "/wake_up", peer_pid=endpoint.peer_pid, api_key=endpoint.api_key
                    )
        except (UpstreamError, TimeoutError) as exc:
            load.scrape_failures += 1
            if load.scrape_failures == 1:
                log.warning("metrics of replica %s unreadable: %s", endpoint.base_url, exc or type(exc).__name__)
            return
        load.scrape_failures = 0
        load.inflight_at_scrape = load.inflight
        load.prompt_tokens_at_scrape = load.inflight_prompt_tokens
