"""``POST /v1/models`` bodies into stored models, and stored models into what ``GET /v1/models`` shows.

A deployment is refused (422 naming the field) when one of its replicas could never run: the same checks as a
workload submission (queue, pool, share) are made on the replica it would start.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import PurePosixPath

from tessera.api import ModelDeploy, ModelOut
from tessera.api.serving import CacheTier
from tessera.core.workload import MILLI_PER_GPU
from tessera.errors import InvalidRequestError
from tessera.server.context import ServerContext
from tessera.server.quantities import parse_cpu_milli, parse_duration_s, parse_mem_mib
from tessera.server.serving_plane import deployed, replica_row
from tessera.server.store import served
from tessera.server.store.models import ServedModelRow, WorkloadRow
from tessera.server.submit import Principal, queue_for
from tessera.serving import engine_settings, weights_cache
from tessera.serving.engine_settings import EngineSettings
from tessera.serving.models import CATALOG
from tessera.serving.replica_health import ModelHealth
from tessera.serving.replicas import DeployedModel
from tessera.serving.setups import DEFAULT_SETUP, PolicySetup, model_autoscaler, serving_setup

NEEDS_WEIGHTS = ("vllm", "sglang")
CHECK_PORT = 1  # a placeholder port: validation only builds the replica's workload, it never starts it


def check_weights_path(path: str) -> None:
    """Refuse (422 naming ``model``) a weights path that can never be a model's weights: the root, a system tree
    (``/proc``, ``/sys``, ``/dev``) or one with ``..``. Whether the tenant may read it is checked as the tenant when
    its files are read (``server.model_cache``, the engine as the tenant's workload)."""
    parts = PurePosixPath(path).parts
    if ".." in parts:
        raise InvalidRequestError("model", "give the weights' path without '..'")
    normal = PurePosixPath(os.path.normpath(path))
    if normal == PurePosixPath("/") or any(normal.is_relative_to(tree) for tree in weights_cache.SYSTEM_TREES):
        raise InvalidRequestError("model", f"{path} is not a model's weights: give the folder of its files")


def model_row(body: ModelDeploy, caller: Principal, ctx: ServerContext, now_s: float) -> ServedModelRow:
    queue = queue_for(body.queue, caller, ctx.store.queues())
    if body.engine in NEEDS_WEIGHTS and not body.model:
        raise InvalidRequestError("model", f"the {body.engine} engine needs the weights: a local model folder")
    if body.engine == "sim" and body.model and body.model not in CATALOG:
        raise InvalidRequestError("model", f"the sim engine plays a catalog model ({', '.join(CATALOG)})")
    if body.model and body.model.startswith("/"):
        check_weights_path(body.model)
    if body.gpu_fraction is not None and body.gpu_mem is not None:
        raise InvalidRequestError("gpu_fraction", "give gpu_fraction or gpu_mem, not both")
    if body.gpus == 0 and (body.gpu_fraction is not None or body.gpu_mem is not None):
        field = "gpu_fraction" if body.gpu_fraction is not None else "gpu_mem"
        raise InvalidRequestError(field, "a GPU share needs gpus >= 1")
    max_replicas = body.max_replicas if body.max_replicas is not None else max(1, body.min_replicas)
    if max_replicas < body.min_replicas:
        raise InvalidRequestError("max_replicas", f"must be >= min_replicas ({body.min_replicas})")
    milli = max(1, round(body.gpu_fraction * MILLI_PER_GPU)) if body.gpu_fraction is not None else 0
    settings = settings_of(body)
    row = ServedModelRow(
        name=body.name,
        tenant=queue.tenant,
        queue=queue.name,
        engine=body.engine,
        weights=body.model or "",
        num_gpus=body.gpus,
        gpu_milli=milli,
        gpu_mem_mib=parse_mem_mib(body.gpu_mem, "gpu_mem") if body.gpu_mem is not None else 0,
        min_replicas=body.min_replicas,
        max_replicas=max_replicas,
        idle_timeout_s=parse_duration_s(body.idle_timeout, "idle_timeout"),
        slo=body.slo,
        router=body.router,
        autoscaler=body.autoscaler,
        engine_args=list(settings.engine_args),
        cpu_milli=settings.cpu_milli,
        cpu_bind=settings.cpu_bind,
        kv_offload_gib=settings.kv_offload_gib,
        kv_events=settings.kv_events,
        desired_replicas=body.min_replicas,
        deleting=False,
        created_at=now_s,
    )
    try:
        replica_row(deployed_draft(row), CHECK_PORT, ctx, now_s)  # refuses what could never run, naming the field
    except InvalidRequestError as exc:
        if exc.field == "cpu":  # the replica's CPU request is the model's ``cpus``
            raise InvalidRequestError("cpus", exc.message) from None
        raise
    return row


def settings_of(body: ModelDeploy) -> EngineSettings:
    """The model's own engine settings, checked (422 naming the field)."""
    settings = EngineSettings(
        engine_args=tuple(body.engine_args),
        cpu_milli=parse_cpu_milli(body.cpus, "cpus") if body.cpus is not None else 0,
        cpu_bind=body.cpu_bind.strip(),
        kv_offload_gib=float(body.kv_offload_gib),
        kv_events=body.kv_events,
    )
    engine_settings.check(body.engine, settings)
    return settings


def deployed_draft(row: ServedModelRow) -> DeployedModel:
    """``row`` as the controller would see it, before it has an id."""
    return dataclasses.replace(deployed(row), id=0)


def model_out(
    row: ServedModelRow,
    replicas: list[WorkloadRow],
    base_url: str,
    tier: str | None = None,
    health: ModelHealth | None = None,
    readiness: served.Readiness | None = None,
    setup: PolicySetup | None = None,
) -> ModelOut:
    setup = setup or serving_setup(DEFAULT_SETUP)
    live = [r for r in replicas if not r.cancel_requested]
    running = served.ready_replicas(live, readiness)
    failing = health is not None and health.failures > 0
    return ModelOut(
        name=row.name,
        tenant=row.tenant,
        queue=row.queue,
        engine=row.engine,
        model=row.weights,
        state=served.model_state(row, replicas, health, readiness),
        replicas=running,
        desired_replicas=row.desired_replicas,
        min_replicas=row.min_replicas,
        max_replicas=row.max_replicas,
        idle_timeout_s=row.idle_timeout_s,
        slo=row.slo,
        router=row.router or setup.router,
        autoscaler=model_autoscaler(setup, row.autoscaler) or "none",
        serving_setup=setup.name,
        gpus=row.num_gpus,
        gpu_milli=row.gpu_milli,
        gpu_mem_mib=row.gpu_mem_mib,
        engine_args=list(row.engine_args or ()),
        cpu_milli=row.cpu_milli or 0,
        cpu_bind=row.cpu_bind or "",
        kv_offload_gib=row.kv_offload_gib or 0.0,
        kv_events=bool(row.kv_events),
        cache=_tier(tier, running),
        replica_workloads=[r.id for r in live],
        openai_base_url=f"{base_url.rstrip('/')}/openai/v1",
        created_at=row.created_at,
        last_error=health.last_error if failing and health is not None else None,
        replica_failures=health.failures if health is not None else 0,
        retry_at=health.retry_at_s if health is not None else None,
    )


def _tier(kept: str | None, running: int) -> CacheTier:
    """The model cache's tier (``server.model_cache``); before its first look, hot with a replica, else cold."""
    if running:
        return "hot"
    if kept == "warm":
        return "warm"
    return "cold"
