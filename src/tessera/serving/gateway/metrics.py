"""The gateway's Prometheus series, per served model and SLO class (``served_model``, ``slo``), observed as requests
end: time to first token, time per output token, time queued at the gateway (held for a replica, then routed),
end-to-end latency, requests by HTTP status, the requests that met their class's SLO (``model_stats.meets_slo``),
the requests bound again because their replica was gone before the first byte of the answer (``retries``), and the
router's decision time; and, unlabelled by model, each SLO class's targets (``tessera_gateway_slo_target_seconds``,
for dashboards to draw the percentiles against).

Time to first token is the time from the request's arrival at the gateway to the first body bytes passed back; for
a streamed answer that is the first token, for a plain one the whole answer. Time per output token is the time
between the first and the last chunk over the chunks after the first (one SSE event per token for vLLM and the sim
engine); it is observed only for answers of two chunks or more. The caller registers ``registry`` where it serves
metrics (``tessera up``: its ``/metrics``, where the ``served_model`` label is for admins only).

``window`` (``tessera up``'s dashboard): each answer is also recorded in a ``model_stats.ModelWindow``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from tessera.serving.model_stats import ModelWindow, meets_slo
from tessera.serving.policies.requests import DEFAULT_SLO_TARGETS, SloTarget

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120)
_TOKEN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.5, 1, 2)
_DECISION_BUCKETS = (1e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 5e-3)
LABELS = ("served_model", "slo")
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]  # an ASGI send


class GatewayMetrics:
    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        window: ModelWindow | None = None,
        targets: dict[str, SloTarget] | None = None,
    ) -> None:
        """``targets``: each SLO class's (by its label), default ``DEFAULT_SLO_TARGETS``."""
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        self.window = window
        self.targets = targets if targets is not None else {c.label: t for c, t in DEFAULT_SLO_TARGETS.items()}
        r = self.registry
        self.ttft = Histogram(
            "tessera_gateway_time_to_first_token_seconds", "From arrival to the first bytes of the answer",
            LABELS, buckets=_LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.tpot = Histogram(
            "tessera_gateway_time_per_output_token_seconds", "Between the answer's chunks after the first",
            LABELS, buckets=_TOKEN_BUCKETS, registry=r,
        )  # fmt: skip
        self.queued = Histogram(
            "tessera_gateway_queue_seconds", "From arrival to being sent to a replica (held while none was ready)",
            LABELS, buckets=_LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.e2e = Histogram(
            "tessera_gateway_request_seconds", "From arrival to the end of the answer",
            LABELS, buckets=_LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.requests = Counter(
            "tessera_gateway_requests", "Requests answered, by HTTP status", (*LABELS, "code"), registry=r
        )
        self.slo_met = Counter(
            "tessera_gateway_slo_met", "Requests answered within their SLO class's TTFT and TPOT targets", LABELS,
            registry=r,
        )  # fmt: skip
        target = Gauge(
            "tessera_gateway_slo_target_seconds", "Each SLO class's target: time to first token, time per output token",
            ("slo", "signal"), registry=r,
        )  # fmt: skip
        for slo, t in self.targets.items():
            target.labels(slo, "ttft").set(t.ttft_s)
            target.labels(slo, "tpot").set(t.tpot_s)
        self.retries = Counter(
            "tessera_gateway_retries",
            "Requests bound again (to another replica, or held for one) because theirs was gone before the first"
            " byte of the answer",
            LABELS, registry=r,
        )  # fmt: skip
        self.decision = Histogram(
            "tessera_gateway_route_decision_seconds", "Time the router took to pick a replica",
            buckets=_DECISION_BUCKETS, registry=r,
        )  # fmt: skip

        # Label children kept (labels() takes a lock and builds the key each time); as many as the series themselves
        self._series: dict[tuple[str, str], tuple[Histogram, Histogram, Histogram, Histogram, Counter]] = {}
        self._counted: dict[tuple[str, str, int], Counter] = {}

    def retried(self, model: str, slo: str) -> None:
        self.retries.labels(model, slo).inc()

    def answered(
        self, model: str, slo: str, code: int, arrival_s: float, sent_s: float, first_s: float | None, end_s: float,
        chunks: int,
    ) -> None:  # fmt: skip
        """One request's end: ``sent_s`` when it went to a replica, ``first_s`` its first bytes back (None: none)."""
        counter = self._counted.get((model, slo, code))
        if counter is None:
            counter = self._counted[(model, slo, code)] = self.requests.labels(model, slo, str(code))
        counter.inc()
        series = self._series.get((model, slo))
        if series is None:
            series = self._series[(model, slo)] = (
                self.queued.labels(model, slo), self.e2e.labels(model, slo), self.ttft.labels(model, slo),
                self.tpot.labels(model, slo), self.slo_met.labels(model, slo),
            )  # fmt: skip
        queued, e2e, ttft, tpot, met_counter = series
        queued.observe(sent_s - arrival_s)
        e2e.observe(end_s - arrival_s)
        ttft_s = tpot_s = None
        if first_s is not None:
            ttft_s = first_s - arrival_s
            ttft.observe(ttft_s)
            if chunks > 1:
                tpot_s = (end_s - first_s) / (chunks - 1)
                tpot.observe(tpot_s)
        met = meets_slo(self.targets.get(slo), code, ttft_s, tpot_s)
        if met:
            met_counter.inc()
        if self.window is not None:
            self.window.record(model, code, met, ttft_s, tpot_s)


class AnswerWatch:
    """Passes an answer on to the client, noting its status, when its first bytes went and how many chunks."""

    __slots__ = ("_send", "_loop", "status", "first_s", "chunks")

    def __init__(self, send: Send, loop: asyncio.AbstractEventLoop) -> None:
        self._send, self._loop = send, loop
        self.status, self.chunks = 0, 0
        self.first_s: float | None = None

    async def send(self, message: MutableMapping[str, Any]) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
        elif message.get("body"):
            self.chunks += 1
            if self.first_s is None:
                self.first_s = self._loop.time()
        await self._send(message)
