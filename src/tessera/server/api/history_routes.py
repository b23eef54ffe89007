"""``GET /v1/history`` (accounting records, like Slurm's ``sacct``), ``GET /v1/history/totals`` (per tenant),
``GET /v1/queues/usage`` (each queue's GPU usage over time, ``server.usage_history``) and ``DELETE /v1/queues/{name}``.
A tenant sees only its own workloads, totals and queues; an admin sees all of them and may narrow them to one tenant.

A record is computed from the workload's row: wait = started - submitted, elapsed = ended - started (to now while
it runs), GPUs = the sum over its workers of GPUs x share, GPU-hours = GPUs x elapsed. A workload that was
preempted and requeued is counted for its last run only (its row keeps the last start)."""

from __future__ import annotations

from collections import defaultdict
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query, status
from fastapi import Path as PathParam

from tessera.api import ErrorOut, HistoryOut, QueueOut, QueueUsageHistory, QueueUsageOut, UsageOut, UsagePoint
from tessera.server.api.routes import ADMIN_ONLY, Caller, StateName, queue_out
from tessera.server.context import ServerContext
from tessera.server.store import accounting
from tessera.server.store.models import WorkloadRow
from tessera.server.store.store import TERMINAL_STATES
from tessera.server.submit import Principal
from tessera.server.usage_history import MAX_POINTS, WINDOW_S

HISTORY_LIMIT = 1000
Since = Annotated[
    float | None,
    Query(ge=0, allow_inf_nan=False, description="seconds since the epoch: only workloads not ended before"),
]
Until = Annotated[
    float | None,
    Query(ge=0, allow_inf_nan=False, description="seconds since the epoch: only workloads submitted by then"),
]
QueueParam = Annotated[str | None, Query(max_length=100)]
TenantParam = Annotated[str | None, Query(max_length=100, description="admin: only this tenant's")]
QueueName = Annotated[str, PathParam(min_length=1, max_length=100)]
IN_USE: dict[int | str, dict[str, Any]] = {
    404: {"model": ErrorOut, "description": "no such queue"},
    409: {"model": ErrorOut, "description": "workloads wait or run in it, or a model deploys into it"},
}


def router(ctx: ServerContext) -> APIRouter:
    api = APIRouter()

    def tenant_of(caller: Principal, tenant: str | None) -> str | None:
        return tenant if caller.is_admin else caller.tenant

    @api.get("/history", response_model=list[HistoryOut], tags=["accounting"])
    def history(
        caller: Caller,
        since: Since = None,
        until: Until = None,
        state: Annotated[list[StateName] | None, Query()] = None,
        queue: QueueParam = None,
        tenant: TenantParam = None,
        limit: Annotated[int, Query(ge=1, le=HISTORY_LIMIT)] = HISTORY_LIMIT,
        after: Annotated[int, Query(ge=0, le=2**62, description="only ids above this (paging)")] = 0,
    ) -> list[HistoryOut]:
        """Every workload whose life (submitted, to ended or now) overlaps ``since``..``until``, oldest first."""
        rows = accounting.history_rows(
            ctx.store,
            tenant=tenant_of(caller, tenant),
            since=since,
            until=until,
            states=state or (),
            queue=queue,
            after_id=after,
            limit=limit,
        )
        now = ctx.clock()
        return [history_out(r, now) for r in rows]

    @api.get("/history/totals", response_model=list[UsageOut], tags=["accounting"])
    def totals(
        caller: Caller, since: Since = None, until: Until = None, queue: QueueParam = None, tenant: TenantParam = None
    ) -> list[UsageOut]:
        """Per-tenant totals of the workloads ``GET /v1/history`` lists for the same filters."""
        now = ctx.clock()
        records: list[HistoryOut] = []
        after = 0
        while True:
            rows = accounting.history_rows(
                ctx.store, tenant=tenant_of(caller, tenant), since=since, until=until, queue=queue, after_id=after
            )
            records.extend(history_out(r, now) for r in rows)
            if len(rows) < HISTORY_LIMIT:
                return usage_totals(records)
            after = rows[-1].id

    @api.get("/queues/usage", response_model=QueueUsageHistory, tags=["queues"])
    def queue_usage(
        caller: Caller,
        queue: Annotated[str | None, Query(min_length=1, max_length=100, description="only this queue")] = None,
        window_s: Annotated[
            float | None,
            Query(gt=0, le=WINDOW_S, allow_inf_nan=False, description="only the samples of the last window_s seconds"),
        ] = None,
        limit: Annotated[int, Query(ge=1, le=MAX_POINTS, description="at most the newest N samples per queue")] = (
            MAX_POINTS
        ),
    ) -> QueueUsageHistory:
        """Each queue's GPU usage over time (in use, borrowed, nominal quota), sampled by the server when it
        changes and at least every ``period_s``, kept in memory for ``window_s``. A tenant gets its own queues; a
        queue that is not its own, or does not exist, is left out."""
        now = ctx.clock()
        rows = [q for q in ctx.store.queues() if caller.may_use(q) and (queue is None or q.name == queue)]
        since = now - window_s if window_s is not None else None
        samples = ctx.usage.read([q.name for q in rows], since, limit)
        return QueueUsageHistory(
            now=now,
            period_s=ctx.usage.period_s,
            window_s=ctx.usage.window_s,
            max_points=ctx.usage.max_points,
            queues=[
                QueueUsageOut(
                    queue=q.name,
                    tenant=q.tenant,
                    points=[
                        UsagePoint(
                            at=s.at,
                            gpu_milli=s.gpu_milli,
                            borrowed_milli=s.borrowed_milli,
                            nominal_milli=s.nominal_milli,
                        )
                        for s in samples[q.name]
                    ],
                )
                for q in rows
            ],
        )

    @api.delete("/queues/{name}", response_model=QueueOut, responses={**ADMIN_ONLY, **IN_USE}, tags=["queues"])
    def delete_queue(name: QueueName, caller: Caller) -> QueueOut:
        """Delete a queue. Refused (409) while workloads of it are pending or running (cancel them, or let them
        end) or a model deploys into it; ended workloads keep its name in their history."""
        if not caller.is_admin:
            raise HTTPException(status.HTTP_403_FORBIDDEN, detail="admin token required")
        found = accounting.delete_queue(ctx.store, name)
        if found is None:
            raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"no queue {name!r}")
        if isinstance(found, accounting.QueueInUse):
            what = [f"{n} {s}" for n, s in ((found.pending, "pending"), (found.running, "running")) if n]
            if found.models:
                what.append(f"model(s) {', '.join(found.models)} deploying into it")
            detail = (
                f"queue {name!r} is in use: {' and '.join(what)}; cancel them (tessera cancel ID) or wait until "
                "they end, then delete it"
            )
            raise HTTPException(status.HTTP_409_CONFLICT, detail=detail)
        ctx.loop.wake()  # the scheduler drops the queue at its next step
        return queue_out(found, ctx, [])

    return api


def history_out(row: WorkloadRow, now: float) -> HistoryOut:
    placement = row.placement or []
    ran = row.started_at is not None
    ended = row.finished_at if row.state in TERMINAL_STATES else None
    elapsed = max(0.0, ((ended if ended is not None else now) - row.started_at)) if row.started_at is not None else 0.0
    if row.state == "pending":  # not running (a requeued one keeps its last start)
        elapsed = 0.0
    gpus = sum(len(p.get("gpus", [])) * int(p.get("gpu_milli", 0)) for p in placement) / 1000
    workers = max(1, len(placement))
    # A resized run: what it used before its current placement, plus the current placement since it began.
    current_s = elapsed
    if elapsed > 0 and row.settled_at is not None:
        current_s = max(0.0, (ended if ended is not None else now) - row.settled_at)
    gpu_s = (row.gpu_s_settled or 0.0) + gpus * current_s
    cpu_s = (row.cpu_s_settled or 0.0) + row.cpu_milli / 1000 * workers * current_s
    wait = (row.started_at - row.submitted_at) if row.started_at is not None else (ended or now) - row.submitted_at
    where = [
        f"{p['node']} GPU {','.join(map(str, p['gpus']))}" if p.get("gpus") else f"{p['node']} (CPU)" for p in placement
    ]
    return HistoryOut(
        id=row.id,
        name=row.name,
        command=list(row.command),
        array_index=row.array_index,
        tenant=row.tenant,
        queue=row.queue,
        state=row.state,
        exit_code=row.exit_code,
        reason=row.reason,
        submitted_at=row.submitted_at,
        started_at=row.started_at,
        ended_at=ended,
        wait_s=round(max(0.0, wait), 3),
        elapsed_s=round(elapsed, 3),
        gpus=gpus,
        gpu_hours=round(gpu_s / 3600, 6) if elapsed > 0 else 0.0,
        cpu_hours=round(cpu_s / 3600, 6) if ran and elapsed > 0 else 0.0,
        where=where,
        gpu_uuids=[u for p in placement for u in p.get("uuids", [])],
        attempts=row.attempts,
    )


def usage_totals(records: list[HistoryOut]) -> list[UsageOut]:
    by_tenant: dict[str, list[HistoryOut]] = defaultdict(list)
    for record in records:
        by_tenant[record.tenant].append(record)
    out = []
    for tenant, mine in sorted(by_tenant.items()):
        waits = [r.wait_s for r in mine if r.started_at is not None and r.wait_s is not None]
        out.append(
            UsageOut(
                tenant=tenant,
                workloads=len(mine),
                succeeded=sum(r.state == "succeeded" for r in mine),
                failed=sum(r.state in ("failed", "cancelled", "preempted") for r in mine),
                gpu_hours=round(sum(r.gpu_hours for r in mine), 6),
                cpu_hours=round(sum(r.cpu_hours for r in mine), 6),
                wait_s_mean=round(sum(waits) / len(waits), 3) if waits else None,
            )
        )
    return out
