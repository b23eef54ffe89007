"""``create_app(ctx)``: the FastAPI application over one server's store and loop.

Errors are JSON: ``{"detail": "...", "field": "..."}`` with 400 (a body that is not UTF-8 text; ``field`` is
``body``), 401 (no or wrong token), 403 (admin only), 404 (not found, including another tenant's workload), 413 (a
body over 1 MiB) or 422 (invalid body; ``field`` names the offending field as the user wrote it, ``body`` when it
is not JSON at all). Anything unexpected is a JSON 500 (``errors.CatchAll``), never plain text.

``/metrics`` without a token leaves out the series labelled by queue (queues are named after tenants); with an
admin token it has them all.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import FastAPI, Header, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException

from tessera.api import API_VERSION, ErrorOut, Health
from tessera.errors import InvalidRequestError
from tessera.server.api import (
    config_routes,
    history_routes,
    model_stats_routes,
    models_routes,
    routes,
    stream_routes,
    web,
)
from tessera.server.api.errors import CatchAll, invalid_body, json_safe
from tessera.server.api.limits import BodyLimit
from tessera.server.auth import principal_for
from tessera.server.context import ServerContext


def create_app(ctx: ServerContext) -> FastAPI:
    app = FastAPI(
        title="Tessera",
        version=API_VERSION,  # the wire format's version (tessera.api), not the package's
        description="Fractional, multi-tenant GPU scheduling: submit workloads, watch queues, nodes and GPUs.",
        docs_url=None,  # web.mount serves /docs from local assets (FastAPI's default loads them from a CDN)
        redoc_url=None,  # the same for /redoc
    )
    app.state.ctx = ctx
    app.add_middleware(BodyLimit)
    app.add_middleware(CatchAll)  # outside BodyLimit: the last added is the outermost
    app.add_exception_handler(RequestValidationError, invalid_body)  # type: ignore[arg-type]  # Starlette's type

    @app.exception_handler(InvalidRequestError)
    async def _invalid_request(_: Request, exc: InvalidRequestError) -> JSONResponse:
        return JSONResponse(status_code=422, content=json_safe({"detail": str(exc), "field": exc.field}))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
        if exc.status_code == 400:  # FastAPI raises it for a body it cannot decode (not UTF-8)
            return JSONResponse(status_code=400, content={"detail": f"body: {exc.detail}", "field": "body"})
        return await http_exception_handler(request, exc)

    @app.get("/healthz", response_model=Health, tags=["operations"], responses={503: _error("starting")})
    def healthz() -> Health | JSONResponse:
        if not ctx.ready:
            return JSONResponse(status_code=503, content={"detail": "starting"})
        gpus = sum(len(d) for d in ctx.pool.devices)
        return Health(
            status="ok", simulated_gpus=ctx.pool.simulated, gpus=gpus, api_version=API_VERSION,
            policy=ctx.loop.preset.name, placement=ctx.loop.placement,
        )  # fmt: skip

    @app.get(
        "/metrics", response_class=PlainTextResponse, tags=["operations"], responses={401: _json_error("bad token")}
    )
    def metrics(authorization: Annotated[str | None, Header()] = None) -> Response:
        registry = ctx.metrics.public
        if authorization is not None:
            caller = principal_for(ctx.store, authorization, ctx.clock())
            if caller is None:
                return JSONResponse(status_code=401, content={"detail": "invalid token"})
            if caller.is_admin:
                registry = ctx.metrics.registry
        return PlainTextResponse(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    errors: dict[int | str, dict[str, Any]] = {
        400: _error("the body could not be decoded"),
        401: _error("missing or invalid token"),
        413: _error("the body is over 1 MiB; `field` is `body`"),
        422: _error("invalid request; `field` names the field"),
    }
    app.include_router(routes.router(ctx), prefix="/v1", responses=errors)
    app.include_router(models_routes.router(ctx), prefix="/v1", responses=errors)
    app.include_router(model_stats_routes.router(ctx), prefix="/v1", responses=errors)
    app.include_router(history_routes.router(ctx), prefix="/v1", responses=errors)
    app.include_router(stream_routes.router(ctx), prefix="/v1", responses=errors)
    app.include_router(config_routes.router(ctx), prefix="/v1", responses=errors)
    web.mount(app)  # /ui (the dashboard) and /docs
    return app


def _error(description: str) -> dict[str, Any]:
    """An error response for the OpenAPI document: every error body is an ``ErrorOut``."""
    return {"model": ErrorOut, "description": description}


def _json_error(description: str) -> dict[str, Any]:
    """``_error`` for a route whose own responses are not JSON (FastAPI would document the error in their type)."""
    schema = {"$ref": "#/components/schemas/ErrorOut"}
    return {"description": description, "content": {"application/json": {"schema": schema}}}
