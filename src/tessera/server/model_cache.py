"""The live model cache of the server's host: which tier each served model is in, and the warm tier kept.

Tiers (``serving.policies.model_cache.Tier``, the part-1 objects the digital twin uses):

- **hot**: a replica runs (its engine holds the weights);
- **warm**: no replica, but the weights are in the host's page cache, so the next replica skips the disk (on the
  CPU a warm start is a process restart from cached files);
- **cold**: no replica and the weights are not (or no longer) cached, or the engine has no weight files (``sim``).

``ModelCacheKeeper`` is told each controller tick which models have replicas (it is a ``ReplicaSink``). When a
model goes from hot to zero replicas it asks for a warm place in a host-memory budget (``admit_warm``: the
lowest-priority, then least recently used, warm models are evicted for it, never a higher-priority one), reads the
weights in if the page cache lost them, and lets the evicted models' pages go (``weights_cache.drop``). The tier it
reports is measured, not assumed: warm means at least ``WARM_AT`` of the bytes are in the page cache now (the
kernel may drop pages on its own under memory pressure).

The weights' path is the tenant's word, so the keeper touches only what the tenant itself may read: it walks the
folder and opens the files as the tenant's OS account (``as_tenant``, when workloads run as tenant users), and
measures, reads in and lets go through those descriptors; a path the tenant may not read is cold and never read.
The work is bounded whatever the path names (``weights_cache``: entries walked, files, no ``/`` nor system trees,
no sparse files, ``mincore`` in windows); weights larger than the whole budget are cold at once, unmeasured. All
file work runs on one background thread, never on the controller's (``publish`` only decides and queues; a model
just scaled to zero shows cold until its weights are measured), and a recheck is not queued behind one not done.

The budget is ``TESSERA_WARM_CACHE_BYTES`` (default: a quarter of the host's memory). The tier only describes the
server's own host: with the Ray backend replicas run on other nodes, whose page caches are not managed here.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from tessera.backends.accounts import Account
from tessera.server.as_tenant import TenantFilesError, as_account
from tessera.serving import weights_cache
from tessera.serving.controller import ReplicaView
from tessera.serving.policies.model_cache import NodeCacheState, Tier, admit_warm, drop_warm
from tessera.serving.replicas import DeployedModel

log = logging.getLogger(__name__)

WARM_AT = 0.9  # the share of the weights' bytes in the page cache that makes a model warm
RECHECK_S = 10.0  # how often a model at zero has its residency measured again
BUDGET_ENV = "TESSERA_WARM_CACHE_BYTES"
FILE_ENGINES = ("vllm", "sglang", "transformers")  # engines that load weight files (the sim has none)
PRIORITY_OF_SLO = {"interactive": 2, "standard": 1, "batch": 0}


def has_weight_files(model: DeployedModel) -> bool:
    """Whether the model's engine loads weight files and the model names them by an absolute path (a catalog or
    hub name is not a file of this host)."""
    return model.engine in FILE_ENGINES and model.weights.startswith("/")


def default_budget_bytes() -> int:
    text = os.environ.get(BUDGET_ENV, "")
    if text.isdigit():
        return int(text)
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 4


class ModelCacheKeeper:
    """See the module docstring. ``tiers`` maps a model id to its tier's name, for ``GET /v1/models``.
    ``account_of(tenant)``: the OS account whose permissions a tenant's weights are read with (None: the server's
    own, as when workloads run as the server's user)."""

    def __init__(
        self,
        budget_bytes: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        background: Callable[[Callable[[], object]], object] | None = None,
        account_of: Callable[[str], Account | None] | None = None,
    ) -> None:
        self.state = NodeCacheState(default_budget_bytes() if budget_bytes is None else budget_bytes)
        self.clock = clock
        self.account_of = account_of
        self.tiers: dict[int, str] = {}
        self.starts: Counter[tuple[str, str]] = Counter()  # (model name, tier it started from)
        self._names: dict[int, str] = {}
        self._models: dict[str, DeployedModel] = {}  # model key -> the model (its weights and tenant)
        self._ids: dict[str, int] = {}  # model key -> model id
        self._hot: set[int] = set()
        self._seen_replicas: set[int] = set()
        self._checked_s: dict[int, float] = {}
        self._unkept: dict[int, str] = {}  # why a model's weights are not kept warm, as last logged
        self._queued: Counter[int] = Counter()  # model id -> file work of it queued or running
        self._lock = threading.RLock()  # re-entered when the file work runs inline (tests)
        if background is None:
            pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tessera-model-cache")
            self._background: Callable[[Callable[[], object]], object] = pool.submit
        else:
            self._background = background

    # ------------------------------------------------------------------------------------------ ReplicaSink
    def publish(self, models: Sequence[DeployedModel], replicas: dict[int, list[ReplicaView]]) -> None:
        """Called each controller tick; decides, and queues the file work (never done on the caller's thread)."""
        now = self.clock()
        with self._lock:
            for model in models:
                self._update(model, replicas.get(model.id, []), now)
            for gone in self.tiers.keys() - {m.id for m in models}:
                self._forget(gone)

    def _update(self, model: DeployedModel, views: list[ReplicaView], now: float) -> None:
        self._names[model.id] = model.name
        self._ids[model.key] = model.id
        for view in views:
            if view.workload_id not in self._seen_replicas:
                self._seen_replicas.add(view.workload_id)
                self.starts[(model.name, self.tiers.get(model.id, Tier.COLD.value))] += 1
        if any(v.running and not v.stopping for v in views):
            self.tiers[model.id] = Tier.HOT.value
            self._hot.add(model.id)
            drop_warm(self.state, model.key)  # in the engine now: no longer counted in the host budget
            return
        if not has_weight_files(model):
            self.tiers[model.id] = Tier.COLD.value
            return
        self._models[model.key] = model
        was_hot = model.id in self._hot
        self._hot.discard(model.id)
        if was_hot:  # just scaled to zero: keep it warm if the budget allows (until measured: cold)
            self.tiers[model.id] = Tier.COLD.value
            self._queue(model, functools.partial(self._keep_warm, model), always=True)
        elif model.id not in self.tiers:  # first seen at zero (a restart): warm only if it is cached already
            self.tiers[model.id] = Tier.COLD.value
            self._queue(model, functools.partial(self._keep_if_cached, model))
        elif now - self._checked_s.get(model.id, -RECHECK_S) >= RECHECK_S:
            self._checked_s[model.id] = now
            self._queue(model, functools.partial(self._measure, model))

    def _queue(self, model: DeployedModel, work: Callable[[], object], always: bool = False) -> None:
        """Queue ``work`` for ``model`` unless work of it is queued already (a recheck never piles up behind a slow
        read); ``always``: queued anyway (a scale to zero's keep-warm, after what is queued)."""
        if self._queued[model.id] and not always:
            return
        self._queued[model.id] += 1

        def run() -> None:
            try:
                work()
            except Exception:  # a tenant's path that cannot be read (or taken as the tenant): the model is cold
                log.exception("model cache: file work for %s failed; it counts as cold", model.key)
                self._set_tier(model, Tier.COLD.value)
            finally:
                with self._lock:
                    self._queued[model.id] -= 1
                    if not self._queued[model.id]:
                        del self._queued[model.id]

        self._background(run)

    # ----------------------------------------------------------------------- file work (background thread)
    def _open(self, model: DeployedModel) -> weights_cache.OpenWeights | None:
        """The model's weight files, looked for and opened as its tenant (the kernel checks each access as for the
        tenant's own workload); None when they are not weights the keeper may keep: unreadable by the tenant, past
        the bounds (``weights_cache``), or larger than the whole budget (never warm, so never measured). What is
        done with them then (measure, read in, let go) is done through these descriptors."""
        try:
            with self._as_tenant(model.tenant):
                found = weights_cache.scan(model.weights)
                if found.total_bytes == 0 or found.total_bytes > self.state.host_capacity_bytes:
                    return None
                return weights_cache.open_weights(found)
        except (OSError, weights_cache.NotWeights, TenantFilesError) as error:
            if self._unkept.get(model.id) != str(error):  # said once per reason, not at every recheck
                self._unkept[model.id] = str(error)
                log.info("model cache: the weights of %s are not kept warm: %s", model.key, error)
            return None

    def _keep_warm(self, model: DeployedModel) -> None:
        opened = self._open(model)
        if opened is None:
            self._set_tier(model, Tier.COLD.value)
            return
        with opened:
            with self._lock:
                if model.id in self._hot or model.id not in self.tiers:  # hot again, or deleted, meanwhile
                    return
                size, priority = opened.weights.total_bytes, PRIORITY_OF_SLO.get(model.slo, 1)
                victims, _ = admit_warm(self.state, model.key, size, priority, self.clock())
                kept = model.key in self.state.warm
                evicted = [self._models[v] for v in victims if v in self._models]
            for victim in evicted:
                log.info("model cache: %s leaves the warm tier for %s", victim.key, model.key)
                self._let_go(victim)
            if not kept:  # no room within the budget, even after evicting what it may: its pages are not kept either
                weights_cache.drop(opened)
            elif weights_cache.resident_fraction(opened) < WARM_AT:
                weights_cache.prefetch(opened)
            self._measure(model, opened)

    def _keep_if_cached(self, model: DeployedModel) -> None:
        if self._measure(model) == Tier.WARM.value:
            self._keep_warm(model)

    def _let_go(self, victim: DeployedModel) -> None:
        opened = self._open(victim)
        if opened is None:
            self._set_tier(victim, Tier.COLD.value)
            return
        with opened:
            weights_cache.drop(opened)
            self._measure(victim, opened)

    def _measure(self, model: DeployedModel, opened: weights_cache.OpenWeights | None = None) -> str:
        """The model's tier from the page cache now; recorded unless it turned hot meanwhile. Measured as the
        server, through descriptors opened as the tenant (``mincore`` answers only a file's owner or writer)."""
        if opened is None:
            opened = self._open(model)
            if opened is None:
                self._set_tier(model, Tier.COLD.value)
                return Tier.COLD.value
            with opened:
                return self._measure(model, opened)
        tier = Tier.WARM.value if weights_cache.resident_fraction(opened) >= WARM_AT else Tier.COLD.value
        self._set_tier(model, tier)
        return tier

    def _set_tier(self, model: DeployedModel, tier: str) -> None:
        with self._lock:
            if model.id in self.tiers and model.id not in self._hot:
                self.tiers[model.id] = tier
                self._checked_s[model.id] = self.clock()

    def _as_tenant(self, tenant: str) -> AbstractContextManager[None]:
        return as_account(self.account_of(tenant) if self.account_of is not None else None)

    def _forget(self, model_id: int) -> None:
        self._unkept.pop(model_id, None)
        self.tiers.pop(model_id, None)
        self._hot.discard(model_id)
        self._checked_s.pop(model_id, None)
        self._names.pop(model_id, None)
        for key in [k for k, i in self._ids.items() if i == model_id]:
            drop_warm(self.state, key)
            self._ids.pop(key, None)
            self._models.pop(key, None)

    # -------------------------------------------------------------------------------------------- metrics
    def collector(self) -> Collector:
        return _CacheCollector(self)


class _CacheCollector(Collector):
    def __init__(self, keeper: ModelCacheKeeper) -> None:
        self.keeper = keeper

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        keeper = self.keeper
        with keeper._lock:
            tiers = dict(keeper.tiers)
            names = dict(keeper._names)
            starts = dict(keeper.starts)
            warm_bytes = keeper.state.used_bytes
            budget = keeper.state.host_capacity_bytes
        tier = GaugeMetricFamily(
            "tessera_model_cache_tier",
            "1 for the tier a served model is in (hot, warm, cold)",
            labels=["served_model", "tier"],
        )
        for model_id, current in sorted(tiers.items()):
            for name in (t.value for t in Tier):
                tier.add_metric([names.get(model_id, str(model_id)), name], float(name == current))
        yield tier
        counted = CounterMetricFamily(
            "tessera_model_starts", "Replicas started, by the tier their model was in (a warm or a cold start)",
            labels=["served_model", "tier"],
        )  # fmt: skip
        for (name, start_tier), count in sorted(starts.items()):
            counted.add_metric([name, start_tier], count)
        yield counted
        yield GaugeMetricFamily(
            "tessera_model_cache_warm_bytes", "Bytes of weights kept warm on this host", value=warm_bytes
        )
        yield GaugeMetricFamily("tessera_model_cache_budget_bytes", "The warm tier's budget on this host", value=budget)
