"""``GET /v1/models/{name}/stats``: a served model's recent requests (rate, TTFT and TPOT percentiles, errors, SLO
attainment; ``serving.model_stats``), the targets of its SLO class, its replicas over time
(``server.replica_history``) and the setup it is served with. Tenant-scoped like the other ``/v1/models`` routes:
another tenant's model is 404, an admin sees every model."""

from __future__ import annotations

import math

from fastapi import APIRouter, HTTPException, status

from tessera.api.serving_stats import (
    ModelSetupOut,
    ModelStatsOut,
    ReplicaPointOut,
    RequestWindowOut,
    SloTargetOut,
)
from tessera.server.api.models_routes import NOT_FOUND, ModelName
from tessera.server.api.routes import Caller
from tessera.server.context import ServerContext
from tessera.server.replica_history import WINDOW_S as REPLICAS_WINDOW_S
from tessera.server.store import served
from tessera.server.store.models import ServedModelRow
from tessera.serving.controller import DEFAULT_TARGETS
from tessera.serving.model_stats import WindowSummary
from tessera.serving.policies.requests import DEFAULT_SLO_TARGETS, SloClass
from tessera.serving.setups import model_autoscaler


def router(ctx: ServerContext) -> APIRouter:
    api = APIRouter(tags=["models"])

    @api.get("/models/{name}/stats", response_model=ModelStatsOut, responses=NOT_FOUND)
    def model_stats(name: ModelName, caller: Caller) -> ModelStatsOut:
        """The model's requests over the last few minutes against its SLO, its replicas over the last hour and its
        serving setup (what the dashboard's models view shows)."""
        row = served.model(ctx.store, name)
        if row is None or not (caller.is_admin or row.tenant == caller.tenant):
            raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"no model {name!r}")
        return stats_out(ctx, row)

    return api


def stats_out(ctx: ServerContext, row: ServedModelRow) -> ModelStatsOut:
    target = DEFAULT_SLO_TARGETS[SloClass.parse(row.slo)]
    history = ctx.replica_history
    points = history.points(row.id) if history is not None else []
    return ModelStatsOut(
        name=row.name,
        tenant=row.tenant,
        now=ctx.clock(),
        targets=SloTargetOut(ttft_s=target.ttft_s, tpot_s=target.tpot_s),
        window=window_out(ctx.model_window.summary(row.name)) if ctx.model_window is not None else None,
        replicas=[ReplicaPointOut(at=p.at, ready=p.ready, running=p.running, pending=p.pending, desired=p.desired)
                  for p in points],
        replicas_window_s=history.window_s if history is not None else REPLICAS_WINDOW_S,
        setup=setup_out(ctx, row),
    )  # fmt: skip


def window_out(s: WindowSummary) -> RequestWindowOut:
    return RequestWindowOut(
        window_s=s.window_s, span_s=s.span_s, requests=s.answered, rate_per_s=s.rate_per_s, errors=s.errors,
        slo_met=s.slo_met, slo_attainment_pct=s.slo_attainment_pct, samples=s.samples, ttft_p50_s=s.ttft_p50_s,
        ttft_p90_s=s.ttft_p90_s, ttft_p99_s=s.ttft_p99_s, tpot_p50_s=s.tpot_p50_s, tpot_p99_s=s.tpot_p99_s,
    )  # fmt: skip


def setup_out(ctx: ServerContext, row: ServedModelRow) -> ModelSetupOut:
    setup = ctx.serving_setup
    return ModelSetupOut(
        serving_setup=setup.name,
        router=row.router or setup.router,
        autoscaler=model_autoscaler(setup, row.autoscaler) or "none",
        slo=row.slo,
        min_replicas=row.min_replicas,
        max_replicas=row.max_replicas,
        idle_timeout_s=row.idle_timeout_s,
        replica_concurrency=math.ceil(DEFAULT_TARGETS.get(row.engine, 0.0)) if setup.late_binding else 0,
    )
