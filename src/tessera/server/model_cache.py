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
kernel may drop pages on its own under memory pressure). File work runs on one background thread.

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
from pathlib import Path

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

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


def default_budget_bytes() -> int:
    text = os.environ.get(BUDGET_ENV, "")
    if text.isdigit():
        return int(text)
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 4


class ModelCacheKeeper:
    """See the module docstring. ``tiers`` maps a model id to its tier's name, for ``GET /v1/models``."""

    def __init__(
        self,
        budget_bytes: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        background: Callable[[Callable[[], object]], object] | None = None,
    ) -> None:
        self.state = NodeCacheState(default_budget_bytes() if budget_bytes is None else budget_bytes)
        self.clock = clock
        self.tiers: dict[int, str] = {}
        self.starts: Counter[tuple[str, str]] = Counter()  # (model name, tier it started from)
        self._names: dict[int, str] = {}
        self._paths: dict[str, Path] = {}  # model key -> its weights
        self._ids: dict[str, int] = {}  # model key -> model id
        self._hot: set[int] = set()
        self._seen_replicas: set[int] = set()
        self._checked_s: dict[int, float] = {}
        self._lock = threading.RLock()  # re-entered when the file work runs inline (tests)
        if background is None:
            pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tessera-model-cache")
            self._background: Callable[[Callable[[], object]], object] = pool.submit
        else:
            self._background = background

    # ------------------------------------------------------------------------------------------ ReplicaSink
    def publish(self, models: Sequence[DeployedModel], replicas: dict[int, list[ReplicaView]]) -> None:
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
        path = self._weights(model)
        if any(v.running and not v.stopping for v in views):
            self.tiers[model.id] = Tier.HOT.value
            self._hot.add(model.id)
            drop_warm(self.state, model.key)  # in the engine now: no longer counted in the host budget
            return
        if path is None:
            self.tiers[model.id] = Tier.COLD.value
            return
        was_hot = model.id in self._hot
        self._hot.discard(model.id)
        if was_hot:  # just scaled to zero: keep it warm if the budget allows
            self._keep_warm(model, path, now)
        elif model.id not in self.tiers:  # first seen at zero (a restart): warm only if it is cached already
            self._measure(model, path, now)
            if self.tiers[model.id] == Tier.WARM.value:
                self._keep_warm(model, path, now)
            return
        if now - self._checked_s.get(model.id, -RECHECK_S) >= RECHECK_S:
            self._measure(model, path, now)

    def _keep_warm(self, model: DeployedModel, path: Path, now: float) -> None:
        size = weights_cache.weights_bytes(path)
        priority = PRIORITY_OF_SLO.get(model.slo, 1)
        victims, _ = admit_warm(self.state, model.key, size, priority, now)
        for victim in victims:
            log.info("model cache: %s leaves the warm tier for %s", victim, model.key)
            self._background(functools.partial(self._let_go, victim))
        if model.key in self.state.warm:
            self._background(functools.partial(self._prefetch, model, path))
        else:  # no room within the budget, even after evicting what it may: its pages are not kept either
            self._background(functools.partial(weights_cache.drop, path))
        self._measure(model, path, now)

    def _let_go(self, key: str) -> None:
        path = self._paths.get(key)
        if path is None:
            return
        weights_cache.drop(path)
        with self._lock:
            model_id = self._ids.get(key)
            if model_id is not None and self.tiers.get(model_id) == Tier.WARM.value:
                cached = weights_cache.resident_fraction(path) >= WARM_AT
                self.tiers[model_id] = Tier.WARM.value if cached else Tier.COLD.value
                self._checked_s[model_id] = self.clock()

    def _prefetch(self, model: DeployedModel, path: Path) -> None:
        if weights_cache.resident_fraction(path) < WARM_AT:
            weights_cache.prefetch(path)
        with self._lock:
            if model.id in self.tiers and self.tiers[model.id] != Tier.HOT.value:
                self._measure(model, path, self.clock())

    def _measure(self, model: DeployedModel, path: Path, now: float) -> None:
        cached = weights_cache.resident_fraction(path) >= WARM_AT
        self.tiers[model.id] = Tier.WARM.value if cached else Tier.COLD.value
        self._checked_s[model.id] = now

    def _weights(self, model: DeployedModel) -> Path | None:
        if model.engine not in FILE_ENGINES or not model.weights:
            return None
        path = Path(model.weights)
        if not path.exists():
            return None
        self._paths[model.key] = path
        return path

    def _forget(self, model_id: int) -> None:
        self.tiers.pop(model_id, None)
        self._hot.discard(model_id)
        self._checked_s.pop(model_id, None)
        self._names.pop(model_id, None)
        for key in [k for k, i in self._ids.items() if i == model_id]:
            drop_warm(self.state, key)
            self._ids.pop(key, None)
            self._paths.pop(key, None)

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
