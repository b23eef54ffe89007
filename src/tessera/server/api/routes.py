"""The ``/v1`` routes. A tenant sees and touches only its own workloads and queues (another tenant's workload is
404, as if it did not exist; on ``/v1/nodes`` it sees the ids of its own workloads only); an admin sees everything
and alone manages queues and tokens."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Header, HTTPException, Query, Request, status
from fastapi import Path as PathParam

from tessera.api import (
    ErrorOut,
    EventOut,
    GpuOut,
    LogChunk,
    NodeOut,
    PlacementOut,
    QueueIn,
    QueueOut,
    TokenIn,
    TokenInfo,
    TokenOut,
    WorkloadOut,
    WorkloadSpec,
)
from tessera.errors import InvalidRequestError
from tessera.server.auth import create_tenant_token, principal_for, revoke_token
from tessera.server.context import ServerContext
from tessera.server.job_submit import workload_rows
from tessera.server.records import gpu_types_of
from tessera.server.store.jobs import add_workloads, set_held
from tessera.server.store.models import QueueRow, TokenRow, WorkloadRow
from tessera.server.store.store import TERMINAL_STATES
from tessera.server.submit import Principal, queue_row

StateName = Literal["pending", "running", "succeeded", "failed", "cancelled", "preempted"]
MAX_LOG_CHUNK = 1 << 20
MAX_RANK = 1 << 20  # a rank's log is asked for by number: more than any job has
WorkloadId = Annotated[int, PathParam(ge=1, le=2**62)]
TokenId = Annotated[int, PathParam(ge=1, le=2**62)]
# Error responses in the OpenAPI document (401 and 422 are declared once for all of /v1, in app.py).
NOT_FOUND: dict[int | str, dict[str, Any]] = {404: {"model": ErrorOut, "description": "no such workload, or not yours"}}
ADMIN_ONLY: dict[int | str, dict[str, Any]] = {403: {"model": ErrorOut, "description": "admin token required"}}
NO_TOKEN: dict[int | str, dict[str, Any]] = {404: {"model": ErrorOut, "description": "no such token"}}
NOT_PENDING: dict[int | str, dict[str, Any]] = {
    **NOT_FOUND,
    409: {"model": ErrorOut, "description": "not pending: only a pending workload is held"},
}


def current_principal(
    request: Request, authorization: Annotated[str | None, Header(include_in_schema=False)] = None
) -> Principal:
    """The caller of a ``/v1`` route, from its bearer token; 401 without a valid one. The header is left out of the
    OpenAPI document's parameters: the document declares it as its bearer security scheme (``api/web.py``)."""
    ctx: ServerContext = request.app.state.ctx
    found = principal_for(ctx.store, authorization, ctx.clock())
    if found is None:
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, "missing or invalid token", {"WWW-Authenticate": "Bearer"})
    return found


Caller = Annotated[Principal, Depends(current_principal)]


def router(ctx: ServerContext) -> APIRouter:
    api = APIRouter()

    def visible(workload_id: int, caller: Principal) -> WorkloadRow:
        row = ctx.store.get_workload(workload_id)
        if row is None or not (caller.is_admin or row.tenant == caller.tenant):
            raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"no workload {workload_id}")
        return row

    def admin_only(caller: Principal) -> None:
        if not caller.is_admin:
            raise HTTPException(status.HTTP_403_FORBIDDEN, detail="admin token required")

    @api.post("/workloads", status_code=201, response_model=WorkloadOut, tags=["workloads"])
    def submit(spec: WorkloadSpec, caller: Caller) -> WorkloadOut:
        """Submit a workload; with ``array``, one per index (the first task is returned: its id is the array's,
        ``GET /v1/workloads?array=ID`` lists them all)."""
        now = ctx.clock()
        rows = workload_rows(spec, caller, ctx.store.queues(), ctx.pool, ctx.store, now, ctx.loop.job_types)
        return workload_out(add_workloads(ctx.store, rows, now)[0], ctx)

    @api.get("/workloads", response_model=list[WorkloadOut], tags=["workloads"])
    def list_workloads(
        caller: Caller,
        state: Annotated[list[StateName] | None, Query()] = None,
        queue: Annotated[str | None, Query(max_length=100)] = None,
        limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
        after: Annotated[int, Query(ge=0, le=2**62, description="only ids above this (paging)")] = 0,
        name: Annotated[str | None, Query(max_length=200, description="only workloads of this name")] = None,
        array: Annotated[int | None, Query(ge=1, le=2**62, description="only the tasks of this array")] = None,
    ) -> list[WorkloadOut]:
        tenant = None if caller.is_admin else caller.tenant
        rows = ctx.store.list_workloads(
            tenant=tenant, states=state or (), queue=queue, limit=limit, after_id=after, name=name, array_id=array
        )
        return [workload_out(r, ctx) for r in rows]

    @api.get("/workloads/{workload_id}", response_model=WorkloadOut, responses=NOT_FOUND, tags=["workloads"])
    def get_workload(workload_id: WorkloadId, caller: Caller) -> WorkloadOut:
        return workload_out(visible(workload_id, caller), ctx)

    @api.post("/workloads/{workload_id}/cancel", response_model=WorkloadOut, responses=NOT_FOUND, tags=["workloads"])
    def cancel(workload_id: WorkloadId, caller: Caller) -> WorkloadOut:
        visible(workload_id, caller)
        row = ctx.store.request_cancel(workload_id, ctx.clock())
        assert row is not None
        ctx.loop.wake()  # the cancel takes effect at the next step, which starts now
        return workload_out(row, ctx)

    def set_hold(workload_id: int, caller: Principal, held: bool) -> WorkloadOut:
        visible(workload_id, caller)
        row, changed = set_held(ctx.store, workload_id, held, ctx.clock())
        assert row is not None
        if not changed and (held or row.held):
            what = "being cancelled" if row.cancel_requested else row.state
            detail = f"workload {workload_id} is {what}: only a pending one is held"
            raise HTTPException(status.HTTP_409_CONFLICT, detail)
        ctx.loop.wake()
        return workload_out(row, ctx)

    @api.post("/workloads/{workload_id}/hold", response_model=WorkloadOut, responses=NOT_PENDING, tags=["workloads"])
    def hold(workload_id: WorkloadId, caller: Caller) -> WorkloadOut:
        """Keep a pending workload from being scheduled until it is released (409 when it is not pending)."""
        return set_hold(workload_id, caller, True)

    @api.post("/workloads/{workload_id}/release", response_model=WorkloadOut, responses=NOT_PENDING, tags=["workloads"])
    def release(workload_id: WorkloadId, caller: Caller) -> WorkloadOut:
        """Let a held workload be scheduled again (a workload that is not held is left as it is; 409 for a held one
        that ended or is being cancelled)."""
        return set_hold(workload_id, caller, False)

    @api.get("/workloads/{workload_id}/events", response_model=list[EventOut], responses=NOT_FOUND, tags=["workloads"])
    def workload_events(workload_id: WorkloadId, caller: Caller) -> list[EventOut]:
        visible(workload_id, caller)
        return [
            EventOut(workload_id=e.workload_id, at=e.at, kind=e.kind, message=e.message)
            for e in ctx.store.events(workload_id)
        ]

    @api.get("/workloads/{workload_id}/logs", response_model=LogChunk, responses=NOT_FOUND, tags=["workloads"])
    def logs(
        workload_id: WorkloadId,
        caller: Caller,
        offset: Annotated[int, Query(ge=0, le=2**62)] = 0,
        limit: Annotated[int, Query(ge=1, le=MAX_LOG_CHUNK)] = 65536,
        tail: Annotated[
            int | None, Query(ge=0, le=1_000_000, description="start at the last N lines instead of at offset")
        ] = None,
        rank: Annotated[
            int, Query(ge=0, le=MAX_RANK, description="a multi-worker job's rank: its own log (0: the workload's)")
        ] = 0,
    ) -> LogChunk:
        """Up to ``limit`` bytes of the log (of rank ``rank`` of a multi-worker job) from ``offset``, ending on a
        whole UTF-8 character (an incomplete one waits for the next chunk), or from the start of its last ``tail``
        lines. Offsets count every byte the workload wrote, also those rotated away; ``offset`` in the answer is
        where ``data`` begins. A rank that has no log is refused (422, ``field`` rank) once the workload started."""
        row = visible(workload_id, caller)
        if row.state != "pending" and not ctx.logs.has_rank(workload_id, rank):
            raise InvalidRequestError("rank", f"workload {workload_id} has no rank {rank} (it has no log)")
        finished = row.state in TERMINAL_STATES
        start = ctx.logs.tail_offset(workload_id, tail, rank) if tail is not None else offset
        read = ctx.logs.read(workload_id, start, limit, finished, rank)
        text = read.data.decode("utf-8", errors="replace")
        return LogChunk(data=text, offset=read.offset, next_offset=read.next_offset, finished=finished)

    @api.get("/nodes", response_model=list[NodeOut], tags=["cluster"])
    def nodes(caller: Caller) -> list[NodeOut]:
        return nodes_out(ctx, None if caller.is_admin else caller.tenant)

    @api.get("/queues", response_model=list[QueueOut], tags=["queues"])
    def queues(caller: Caller) -> list[QueueOut]:
        counts = ctx.store.count_by_state_and_queue()
        return [queue_out(q, ctx, counts) for q in ctx.store.queues() if caller.may_use(q)]

    @api.post("/queues", status_code=201, response_model=QueueOut, responses=ADMIN_ONLY, tags=["queues"])
    def put_queue(body: QueueIn, caller: Caller) -> QueueOut:
        admin_only(caller)
        existing = ctx.store.queue(body.name)  # a replaced queue keeps its creation time: re-applying changes nothing
        row = ctx.store.put_queue(queue_row(body, existing.created_at if existing else ctx.clock()))
        return queue_out(row, ctx, ctx.store.count_by_state_and_queue())

    @api.post("/tokens", status_code=201, response_model=TokenOut, responses=ADMIN_ONLY, tags=["tokens"])
    def create_token(body: TokenIn, caller: Caller) -> TokenOut:
        admin_only(caller)
        secret, queue = create_tenant_token(ctx.store, body.tenant, body.label, ctx.clock())
        return TokenOut(token=secret, tenant=body.tenant, queue=queue.name)

    @api.get("/tokens", response_model=list[TokenInfo], responses=ADMIN_ONLY, tags=["tokens"])
    def list_tokens(caller: Caller) -> list[TokenInfo]:
        admin_only(caller)
        return [token_info(row) for row in ctx.store.tokens()]

    @api.delete("/tokens/{token_id}", response_model=TokenInfo, responses={**ADMIN_ONLY, **NO_TOKEN}, tags=["tokens"])
    def delete_token(token_id: TokenId, caller: Caller) -> TokenInfo:
        """Revoke a token: it stops working at once. The last admin token cannot be revoked (422)."""
        admin_only(caller)
        try:
            return token_info(revoke_token(ctx.store, token_id))
        except LookupError:
            raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"no token {token_id}") from None

    return api


def workload_out(row: WorkloadRow, ctx: ServerContext) -> WorkloadOut:
    placement = None
    if row.placement is not None and row.state == "running":
        placement = [PlacementOut(**p) for p in row.placement]
    return WorkloadOut(
        id=row.id,
        name=row.name,
        tenant=row.tenant,
        queue=row.queue,
        kind=row.kind,
        state=row.state,  # type: ignore[arg-type]  # stored from WorkloadState values
        reason=row.reason,
        priority=row.priority,
        priority_class=row.priority_class,
        gpus=row.num_gpus,
        gpu_milli=row.gpu_milli,
        gpu_mem_mib=row.gpu_mem_mib,
        gpu_types=sorted(gpu_types_of(row.gpu_types)),
        cpu_milli=row.cpu_milli,
        mem_mib=row.mem_mib,
        command=list(row.command),
        submitted_at=row.submitted_at,
        started_at=row.started_at,
        finished_at=row.finished_at,
        exit_code=row.exit_code,
        attempts=row.attempts,
        placement=placement,
        simulated_gpus=row.num_gpus > 0 and ctx.pool.simulated,
        cwd=row.cwd,
        time_limit_s=row.time_limit_s,
        held=bool(row.held),
        dependency=row.dependency,
        array_id=row.array_id,
        array_index=row.array_index,
        workers=len(placement) if placement else row.workers,
        workers_asked=row.workers,
        elastic_min=row.elastic_min,
        elastic_max=row.elastic_max,
        job_type=row.job_type,
        checkpointable=bool(row.checkpointable),
    )


def token_info(row: TokenRow) -> TokenInfo:
    return TokenInfo(
        id=row.id,
        tenant=row.tenant,
        label=row.label,
        admin=row.is_admin,
        created_at=row.created_at,
        last_used_at=row.last_used_at,
    )


def nodes_out(ctx: ServerContext, tenant: str | None = None) -> list[NodeOut]:
    """Nodes and GPUs; with ``tenant``, a GPU lists only that tenant's workloads (the others' ids are not its
    business), though its allocation counts them all."""
    snap = ctx.loop.snapshot
    shown: set[int] | None = None
    if tenant is not None:
        on_gpus = {w for ids in snap.gpu_workloads.values() for w in ids}
        shown = {w for w, owner in ctx.store.tenants_of(on_gpus).items() if owner == tenant}
    out: list[NodeOut] = []
    for n, node in enumerate(ctx.pool.nodes):
        if n in ctx.pool.gone or n >= len(snap.cpu_free_milli):  # left, or joined after this snapshot
            continue
        gpus = [
            GpuOut(
                index=g,
                uuid=d.uuid,
                model=d.model,
                mem_mib=d.mem_mib,
                simulated=d.simulated,
                allocated_milli=snap.allocated_milli(n, g),
                workloads=sorted(w for w in snap.gpu_workloads.get((n, g), []) if shown is None or w in shown),
            )
            for g, d in enumerate(ctx.pool.devices[n])
        ]
        out.append(
            NodeOut(
                name=node.name,
                gpu_model=node.gpu_model,
                cpu_milli=node.cpu_milli,
                cpu_free_milli=int(snap.cpu_free_milli[n]),
                mem_mib=node.mem_mib,
                mem_free_mib=int(snap.mem_free_mib[n]),
                gpus=gpus,
            )
        )
    return out


def queue_out(row: QueueRow, ctx: ServerContext, by_state_and_queue: list[tuple[str, str, int]]) -> QueueOut:
    usage = ctx.loop.snapshot.queue_usage.get(row.name, {})
    counts = {(s, q): n for s, q, n in by_state_and_queue if q == row.name}
    return QueueOut(
        name=row.name,
        tenant=row.tenant,
        cohort=row.cohort,
        nominal=row.nominal,
        borrowing_limit=row.borrowing_limit,
        lending_limit=row.lending_limit,
        weight=row.weight,
        strategy=row.strategy,
        usage={f: {"gpu_milli": u[0], "cpu_milli": u[1], "mem_mib": u[2]} for f, u in usage.items()},
        pending=counts.get(("pending", row.name), 0),
        running=counts.get(("running", row.name), 0),
    )
