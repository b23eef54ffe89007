"""Tables of the control plane. Times are seconds since the epoch (float) so SQLite and PostgreSQL agree exactly.

A workload row holds everything needed to rebuild the scheduler's view after a restart: its request, its state,
where it was placed (node name, GPU indices, share, GPU UUIDs) and how its backend finds it again (its ``Handle``).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import JSON, Boolean, Float, ForeignKey, Integer, String, Text, false
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    pass


class WorkloadRow(Base):
    __tablename__ = "workloads"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(200), default="")
    tenant: Mapped[str] = mapped_column(String(100), index=True)
    queue: Mapped[str] = mapped_column(String(100), index=True)
    kind: Mapped[str] = mapped_column(String(20), default="batch")  # batch | service
    state: Mapped[str] = mapped_column(String(20), index=True)  # core.workload.WorkloadState values
    priority: Mapped[int] = mapped_column(Integer, default=0)
    priority_class: Mapped[str] = mapped_column(String(50), default="")
    preemptible: Mapped[bool] = mapped_column(Boolean, default=True)
    # The request (per worker), in core.workload.Request's units.
    num_gpus: Mapped[int] = mapped_column(Integer, default=0)
    gpu_milli: Mapped[int] = mapped_column(Integer, default=0)
    gpu_mem_mib: Mapped[int] = mapped_column(Integer, default=0)
    gpu_types: Mapped[str] = mapped_column(String(200), default="")  # comma-joined canonical models; "" = any
    cpu_milli: Mapped[int] = mapped_column(Integer, default=0)
    mem_mib: Mapped[int] = mapped_column(Integer, default=0)
    gpu_compute_pct: Mapped[int | None] = mapped_column(Integer, nullable=True)  # MPS compute limit; None = share
    command: Mapped[list[str]] = mapped_column(JSON)
    env: Mapped[dict[str, str]] = mapped_column(JSON, default=dict)
    submitted_at: Mapped[float] = mapped_column(Float)
    started_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    finished_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    exit_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    reason: Mapped[str] = mapped_column(Text, default="")  # why it is pending, or how it ended
    attempts: Mapped[int] = mapped_column(Integer, default=0)  # launches so far (a requeue launches again)
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    stop_reason: Mapped[str | None] = mapped_column(String(200), nullable=True)  # set when a stop was sent
    # Where it runs: [{"node": str, "gpus": [int], "gpu_milli": int, "uuids": [str]}], one entry per worker.
    placement: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON, nullable=True)
    # The quota charge (core Admission): {"queue", "flavor_key", "from_nominal": [g, c, m], "borrowed": [g, c, m]}.
    admission: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    # How its backend finds it again (backends.base.Handle.to_json(), opaque here); None while running = launch not
    # yet confirmed.
    handle: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    log_path: Mapped[str] = mapped_column(String(500), default="")
    # A replica of a deployed model (``ServedModelRow.id``); None for any other workload.
    model_id: Mapped[int | None] = mapped_column(Integer, nullable=True, index=True)
    # Job options (revision 0005): where it runs, its walltime, a hold, what it waits for, the array it is part of.
    cwd: Mapped[str | None] = mapped_column(Text, nullable=True)  # None: the account's home or the server's directory
    time_limit_s: Mapped[float | None] = mapped_column(Float, nullable=True)  # stopped this long after it started
    held: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())  # not scheduled until released
    dependency: Mapped[str | None] = mapped_column(Text, nullable=True)  # "afterok:12:13", as given (arrays expanded)
    array_id: Mapped[int | None] = mapped_column(Integer, nullable=True, index=True)  # its first task's id
    array_index: Mapped[int | None] = mapped_column(Integer, nullable=True)
    array_limit: Mapped[int | None] = mapped_column(Integer, nullable=True)  # at most this many tasks run at once
    # Job shapes (revision 0006): the workers it asks for (a gang: one process per worker, placed all or nothing),
    # its elastic range (None: rigid), its job type (the throughput model's name; "" = unknown) and whether it
    # resumes from its own checkpoints (then preemption may pick it).
    workers: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    elastic_min: Mapped[int | None] = mapped_column(Integer, nullable=True)
    elastic_max: Mapped[int | None] = mapped_column(Integer, nullable=True)
    job_type: Mapped[str] = mapped_column(String(100), default="", server_default="")
    checkpointable: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    # A resized run's accounting: GPU- and CPU-seconds of its earlier placements (settled at each resize), and when
    # its current placement began (None: at started_at).
    gpu_s_settled: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")
    cpu_s_settled: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")
    settled_at: Mapped[float | None] = mapped_column(Float, nullable=True)


class EventRow(Base):
    __tablename__ = "events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    workload_id: Mapped[int | None] = mapped_column(ForeignKey("workloads.id"), nullable=True, index=True)
    at: Mapped[float] = mapped_column(Float)
    kind: Mapped[str] = mapped_column(String(50))  # submitted, bound, started, pending, preempted, finished, ...
    message: Mapped[str] = mapped_column(Text, default="")


class TokenRow(Base):
    """A bearer token, without its secret: the secret's HMAC-SHA256 under the server's token key (``hash_scheme``
    ``hmac-sha256``), or its plain SHA-256 for a token stored by a server before revision 0003 (``sha256``, rehashed
    the first time it is used). A revoked token's row is deleted."""

    __tablename__ = "tokens"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)  # hex digest, see hash_scheme
    tenant: Mapped[str | None] = mapped_column(String(100), nullable=True)  # None for an admin token
    is_admin: Mapped[bool] = mapped_column(Boolean, default=False)
    label: Mapped[str] = mapped_column(String(200), default="")
    created_at: Mapped[float] = mapped_column(Float)
    hash_scheme: Mapped[str] = mapped_column(String(20), default="hmac-sha256", server_default="sha256")
    last_used_at: Mapped[float | None] = mapped_column(Float, nullable=True)  # to the minute (see Store.token)


class QueueRow(Base):
    __tablename__ = "queues"

    name: Mapped[str] = mapped_column(String(100), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(100), index=True)
    cohort: Mapped[str | None] = mapped_column(String(100), nullable=True)
    # Per flavor ("*" or a GPU model): {"gpu_milli": int, "cpu_milli": int, "mem_mib": int}; {} = unlimited.
    nominal: Mapped[dict[str, dict[str, int]]] = mapped_column(JSON, default=dict)
    borrowing_limit: Mapped[dict[str, dict[str, int]] | None] = mapped_column(JSON, nullable=True)
    lending_limit: Mapped[dict[str, dict[str, int]] | None] = mapped_column(JSON, nullable=True)
    weight: Mapped[float] = mapped_column(Float, default=1.0)
    strategy: Mapped[str] = mapped_column(String(20), default="BestEffortFIFO")
    created_at: Mapped[float] = mapped_column(Float)


class ServedModelRow(Base):
    """A model deployed with ``tessera models deploy``: what each replica asks for and runs, and its scaling bounds.
    Its replicas are workload rows carrying its id (``WorkloadRow.model_id``)."""

    __tablename__ = "served_models"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(100), unique=True)  # clients name it alone: one namespace for all
    tenant: Mapped[str] = mapped_column(String(100), index=True)
    queue: Mapped[str] = mapped_column(String(100))
    engine: Mapped[str] = mapped_column(String(20))  # vllm | sglang | transformers | sim
    weights: Mapped[str] = mapped_column(Text, default="")  # a folder, or a catalog name for sim
    num_gpus: Mapped[int] = mapped_column(Integer, default=1)
    gpu_milli: Mapped[int] = mapped_column(Integer, default=0)
    gpu_mem_mib: Mapped[int] = mapped_column(Integer, default=0)
    # Its own engine settings (serving.engine_settings; revision 0009, older models have none): the engine's own
    # arguments, each replica's CPU request and the cores it binds among, vLLM's KV offloading and KV events.
    engine_args: Mapped[list[str]] = mapped_column(JSON, default=list, server_default="[]")
    cpu_milli: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    cpu_bind: Mapped[str] = mapped_column(String(200), default="", server_default="")
    kv_offload_gib: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")
    kv_events: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    min_replicas: Mapped[int] = mapped_column(Integer, default=1)
    max_replicas: Mapped[int] = mapped_column(Integer, default=1)
    idle_timeout_s: Mapped[float] = mapped_column(Float, default=30.0)
    slo: Mapped[str] = mapped_column(String(20), default="standard")
    # How the gateway picks a replica for each request (serving.policies.router; revision 0007) and how its replicas
    # are scaled (serving.setups.AUTOSCALER_NAMES or "none"; revision 0008); None: the server's serving setup's.
    router: Mapped[str | None] = mapped_column(String(30), nullable=True, default=None)
    autoscaler: Mapped[str | None] = mapped_column(String(20), nullable=True, default=None)
    desired_replicas: Mapped[int] = mapped_column(Integer, default=1)  # the controller's last decision
    deleting: Mapped[bool] = mapped_column(Boolean, default=False)  # replicas are being stopped, then the row goes
    created_at: Mapped[float] = mapped_column(Float)


class MetaRow(Base):
    """Key/value facts about the installation (e.g. the GPU pool the store was last served with)."""

    __tablename__ = "meta"

    key: Mapped[str] = mapped_column(String(100), primary_key=True)
    value: Mapped[Any] = mapped_column(JSON)
