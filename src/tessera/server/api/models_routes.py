"""The ``/v1/models`` routes: deploy, list, show and delete served models (``tessera models``). A tenant sees and
touches only its own models (another tenant's is 404); an admin sees every tenant's. A model's name is what OpenAI
clients send, so names are one namespace for all tenants: a name in use is 409, whoever uses it."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query, Request, status
from fastapi import Path as PathParam

from tessera.api import ErrorOut, ModelDeploy, ModelOut
from tessera.server.api.routes import Caller
from tessera.server.context import ServerContext
from tessera.server.serving_models import model_out, model_row
from tessera.server.store import served
from tessera.server.store.models import ServedModelRow
from tessera.server.submit import Principal

ModelName = Annotated[str, PathParam(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9_.-]+$")]
TenantParam = Annotated[str | None, Query(max_length=100, description="admin: only this tenant's models")]
NOT_FOUND: dict[int | str, dict[str, Any]] = {404: {"model": ErrorOut, "description": "no such model, or not yours"}}
CONFLICT: dict[int | str, dict[str, Any]] = {409: {"model": ErrorOut, "description": "the name is taken"}}


def router(ctx: ServerContext) -> APIRouter:
    api = APIRouter(tags=["models"])

    def out(rows: list[ServedModelRow], request: Request) -> list[ModelOut]:
        replicas = served.active_replicas(ctx.store, [r.id for r in rows])
        base = str(request.base_url)
        tiers, health = ctx.model_tiers, ctx.model_health
        ready = ctx.replica_ready
        setup = ctx.serving_setup
        return [model_out(r, replicas[r.id], base, tiers.get(r.id), health.get(r.id), ready, setup) for r in rows]

    def visible(name: str, caller: Principal) -> ServedModelRow:
        row = served.model(ctx.store, name)
        if row is None or not (caller.is_admin or row.tenant == caller.tenant):
            raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"no model {name!r}")
        return row

    @api.post("/models", status_code=201, response_model=ModelOut, responses=CONFLICT)
    def deploy(body: ModelDeploy, caller: Caller, request: Request) -> ModelOut:
        """Deploy a model: its replicas are ``service`` workloads placed by the scheduler, scaled by the serving
        controller between ``min_replicas`` and ``max_replicas``."""
        now = ctx.clock()
        row = model_row(body, caller, ctx, now)
        try:
            served.add_model(ctx.store, row)
        except served.ModelExistsError as exc:
            raise HTTPException(status.HTTP_409_CONFLICT, detail=exc.message) from None
        return out([row], request)[0]

    @api.get("/models", response_model=list[ModelOut])
    def list_models(caller: Caller, request: Request, tenant: TenantParam = None) -> list[ModelOut]:
        scope = tenant if caller.is_admin else caller.tenant
        return out(served.models(ctx.store, scope), request)

    @api.get("/models/{name}", response_model=ModelOut, responses=NOT_FOUND)
    def get_model(name: ModelName, caller: Caller, request: Request) -> ModelOut:
        return out([visible(name, caller)], request)[0]

    @api.delete("/models/{name}", response_model=ModelOut, responses=NOT_FOUND)
    def delete_model(name: ModelName, caller: Caller, request: Request) -> ModelOut:
        """Delete a model: its replicas are stopped, then it is gone (its replicas' workloads stay as history)."""
        row = visible(name, caller)
        served.mark_deleting(ctx.store, row.id)
        row.deleting, row.desired_replicas = True, 0
        return out([row], request)[0]

    return api
