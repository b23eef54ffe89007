"""The accounting bodies (``GET /v1/history``, ``GET /v1/history/totals``): what a workload used, like Slurm's
``sacct``, and per-tenant totals. Derived from the workload's stored row, which keeps its placement and times after
it ends. Also each queue's GPU usage over time (``GET /v1/queues/usage``), sampled by the server in memory."""

from __future__ import annotations

from pydantic import BaseModel, Field


class HistoryOut(BaseModel):
    id: int
    name: str
    command: list[str] = Field(default_factory=list, description="what it ran (argv)")
    array_index: int | None = Field(default=None, description="its index, for a task of an array")
    tenant: str
    queue: str
    state: str
    exit_code: int | None
    reason: str = Field(description="how it ended, or why it waits")
    submitted_at: float
    started_at: float | None = Field(description="when its last run started; None: never ran")
    ended_at: float | None
    wait_s: float | None = Field(description="submitted to started (to now while it waits)")
    elapsed_s: float = Field(description="started to ended (to now while it runs); 0 if it never ran")
    gpus: float = Field(description="GPUs it held: workers x GPUs x share (0.5 for half a GPU)")
    gpu_hours: float = Field(description="gpus x elapsed, in hours")
    cpu_hours: float
    where: list[str] = Field(description="where it ran: node and GPU indices per worker, kept after it ends")
    gpu_uuids: list[str]
    attempts: int = Field(description="launches (a preempted and requeued workload runs again)")


class UsageOut(BaseModel):
    tenant: str
    workloads: int
    succeeded: int
    failed: int = Field(description="failed, cancelled and preempted")
    gpu_hours: float
    cpu_hours: float
    wait_s_mean: float | None = Field(description="mean wait of the workloads that started")


class UsagePoint(BaseModel):
    at: float = Field(description="when it was sampled, seconds since the epoch (the server's clock)")
    gpu_milli: int = Field(description="GPU share in use, in thousandths of a GPU (500: half a GPU)")
    borrowed_milli: int = Field(description="of it, in use beyond the nominal quota (borrowed from the cohort)")
    nominal_milli: int | None = Field(description="the GPU nominal quota then; None: no GPU quota (the whole pool)")


class QueueUsageOut(BaseModel):
    queue: str
    tenant: str
    points: list[UsagePoint] = Field(description="oldest first")


class QueueUsageHistory(BaseModel):
    now: float = Field(description="the server's clock when it answered")
    period_s: float = Field(description="a queue is sampled when its usage changes, and at least this often")
    window_s: float = Field(description="how far back the server keeps samples (in memory: a restart starts over)")
    max_points: int = Field(description="the most samples kept per queue")
    queues: list[QueueUsageOut]
