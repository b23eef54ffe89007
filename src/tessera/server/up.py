"""``tessera up``: one process with the HTTP API, the scheduler loop and the local backend.

``build_server`` wires the parts (store, pool, backend, loop, metrics, app) and is what tests call with fakes;
``serve`` adds the server's private files and umask (``host.py``), the admin token, recovery, the loop thread and
uvicorn. The admin token and the database URL come from the environment or a file, never a command line.
"""

from __future__ import annotations

import dataclasses
import logging
import signal
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, cast

import uvicorn
from fastapi import FastAPI
from prometheus_client.registry import Collector

from tessera.backends.accounts import TenantAccounts
from tessera.backends.base import Backend
from tessera.backends.local import LocalBackend
from tessera.errors import InvalidRequestError
from tessera.faults import check_environment, check_failures
from tessera.gpu.dcgm import GpuUsageCollector
from tessera.gpu.discovery import detect_gpus
from tessera.gpu.gpus import GpuProbe, ProcessMemoryProbe, ProcessUsageProbe
from tessera.gpu.isolation import mps_available
from tessera.server.api.app import create_app
from tessera.server.auth import create_tenant_token, ensure_admin_token, token_key
from tessera.server.context import ServerContext
from tessera.server.demo import DEMO_TENANT, submit_demo
from tessera.server.engine_runner import EngineRunner
from tessera.server.host import (
    isolation_notice,
    make_private,
    raise_open_files_limit,
    run_as_mode,
    tenant_accounts,
)
from tessera.server.logfiles import LogFiles
from tessera.server.loop import SchedulerLoop
from tessera.server.loop_values import LoopConfig, StepReport
from tessera.server.metrics import ServerMetrics
from tessera.server.model_cache import ModelCacheKeeper
from tessera.server.node_sync import NodeFollower
from tessera.server.pool import HostResources, Pool, detect_host
from tessera.server.ray_up import connect as connect_ray
from tessera.server.records import unlimited_queue
from tessera.server.replica_history import ReplicaHistory
from tessera.server.serving_plane import ServingPlane, start_controller
from tessera.server.store import served
from tessera.server.store.db import open_engine
from tessera.server.store.store import Store
from tessera.server.submit import DEFAULT_QUEUE
from tessera.serving.controller import DemandSource, ReplicaSink
from tessera.serving.model_stats import ModelWindow
from tessera.serving.replica_health import ModelHealth
from tessera.serving.setups import DEFAULT_SETUP, PolicySetup, serving_setup, with_setup_knobs

log = logging.getLogger(__name__)

DEFAULT_PORT = 8470
BACKENDS = ("local", "ray")


@dataclass(frozen=True, slots=True)
class UpConfig:
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    data_dir: Path = Path(".tessera")  # the SQLite file, logs and process files
    db_url: str | None = None  # None: SQLite at data_dir/tessera.db
    gpus: str = "auto"  # "auto" (NVML, else a simulated pool) or a simulated pool such as "4xA100-80GB,2xT4"
    admin_token: str | None = None  # None: generate one on first start and print it once
    loop: LoopConfig | None = None  # None: defaults with run_dir = data_dir
    run_as: str = "auto"  # host.RUN_AS_MODES: auto = tenant-users for a root server, else server
    tenant_users: tuple[tuple[str, str], ...] = ()  # (tenant, OS user) for tenant-users; others get tessera-<tenant>
    homes_dir: Path | None = None  # the tenant users' homes; None: data_dir/homes
    backend: str = "local"  # BACKENDS: where workloads run
    ray_address: str | None = None  # --backend ray: the cluster to join; None: start a local one (server.ray_up)
    serving_setup: str = DEFAULT_SETUP  # the serving setup (serving.setups) its gateway and controller run...
    serving_knobs: tuple[str, ...] = ()  # ...with these KEY=VALUE knobs (--serving-set)

    def __post_init__(self) -> None:
        if not 0 < self.port < 65536:
            raise InvalidRequestError("--port", f"must be 1..65535, got {self.port}")
        if self.backend not in BACKENDS:
            raise InvalidRequestError("--backend", f"must be one of {', '.join(BACKENDS)}, got {self.backend!r}")
        if self.ray_address is not None and self.backend != "ray":
            raise InvalidRequestError("--ray-address", "only with --backend ray")
        self.setup()  # an unknown setup or knob: one line naming the option

    def setup(self) -> PolicySetup:
        """The serving setup with its knobs."""
        return with_setup_knobs(
            serving_setup(self.serving_setup, "--serving-setup"), self.serving_knobs, "--serving-set"
        )

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def homes(self) -> Path:
        """Absolute: it becomes the tenant users' home directories (``useradd`` refuses a relative one)."""
        return (self.homes_dir or self.data_dir / "homes").absolute()


@dataclass
class Server:
    ctx: ServerContext
    app: FastAPI
    backend: Backend
    stopping: threading.Event = field(default_factory=threading.Event)
    notice: str = ""  # what the operator is told about the backend at start ("" for the local one)
    closers: list[Callable[[], None]] = field(default_factory=list)  # called once the loop has stopped
    accounts: TenantAccounts | None = None  # the tenants' OS accounts (tenant-users), None: the server's own


def build_server(
    config: UpConfig,
    *,
    probe: GpuProbe | None = None,
    backend: Backend | None = None,
    host: HostResources | None = None,
    clock: Callable[[], float] = time.time,
) -> Server:
    notice, ray_pool, setup, accounts = "", None, None, None
    if backend is None and config.backend == "ray":
        setup = connect_ray(config.ray_address, config.gpus, config.data_dir)
        backend, probe, ray_pool, notice = setup.backend, setup.probe, setup.pool, setup.notice
    probe = probe if probe is not None else detect_gpus(config.gpus)
    pool = ray_pool or Pool.from_devices(probe.devices(), host or detect_host())
    store = Store(open_engine(config.db_url or str(config.data_dir / "tessera.db")), token_key(config.data_dir))
    loop_config = config.loop or LoopConfig(run_dir=config.data_dir)
    if not pool.simulated and mps_available():
        log.info("an MPS daemon serves the GPUs: workloads get MPS compute and memory limits")
        loop_config = dataclasses.replace(loop_config, mps=True)
    if backend is None:
        accounts = tenant_accounts(run_as_mode(config.run_as), config.homes, dict(config.tenant_users))
        backend = LocalBackend(loop_config.run_dir / "runs", accounts=accounts)
    runner: Backend = backend
    _check_pool(store, pool)
    _ensure_default_queue(store, clock())
    loop = SchedulerLoop(store, runner, pool, loop_config, clock, memory_probe=_memory_probe(probe, pool))
    model_health: dict[int, ModelHealth] = {}
    metrics = ServerMetrics(store, loop, clock, _usage_probe(probe, pool), runner.pids, model_health)
    loop.on_start = lambda row, waited: metrics.pending_seconds.labels(row.queue).observe(waited)
    if not pool.simulated:
        metrics.register(GpuUsageCollector(probe))
    ctx = ServerContext(store, loop, pool, metrics, clock, LogFiles(loop.log_path))
    ctx.serving_setup, ctx.serving_knobs = config.setup(), config.serving_knobs
    ctx.model_health = model_health

    def on_step(report: StepReport) -> None:
        metrics.observe_step(report.duration_s, report.cpu_s)
        ctx.usage.observe(clock(), loop.queue_specs, loop.snapshot.queue_usage)

    loop.on_step = on_step
    server = Server(ctx, create_app(ctx), runner, notice=notice, accounts=accounts)
    if setup is not None:  # the Ray cluster's nodes join and leave while the server runs (server.node_sync)
        NodeFollower(setup.watch.latest, loop).attach()
        setup.watch.start()
        server.closers.append(setup.watch.stop)
    return server


def _memory_probe(probe: GpuProbe, pool: Pool) -> ProcessMemoryProbe | None:
    """The probe for the memory watchdog: only real GPUs read through NVML report per-process memory."""
    if pool.simulated or not hasattr(probe, "process_memory"):
        return None
    return cast(ProcessMemoryProbe, probe)


def _usage_probe(probe: GpuProbe, pool: Pool) -> ProcessUsageProbe | None:
    """Per-process GPU use for the metrics: only real GPUs read through NVML report it."""
    if pool.simulated or not hasattr(probe, "process_utilization"):
        return None
    return cast(ProcessUsageProbe, probe)


def _check_pool(store: Store, pool: Pool) -> None:
    described = pool.describe()
    previous = store.meta("pool")
    if previous is not None and previous != described:
        log.warning("the GPU pool differs from the one this store was last served with; placements are re-checked")
    store.set_meta("pool", described)


def _ensure_default_queue(store: Store, now_s: float) -> None:
    if not store.queues():
        store.put_queue(unlimited_queue(DEFAULT_QUEUE, DEFAULT_QUEUE, now_s))


def start_loop(server: Server) -> threading.Thread:
    loop = server.ctx.loop
    recovered = loop.recover()
    if recovered:
        log.info("re-adopted %d running workloads", recovered)
    server.ctx.ready = True
    thread = threading.Thread(target=loop.run_forever, args=(server.stopping.is_set,), name="tessera-loop", daemon=True)
    thread.start()
    return thread


def _exit_cleanly(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(0)


@dataclass
class ServingFront:
    """What ``tessera up`` serves in front of models (the CLI composes the OpenAI-compatible gateway, a sibling of
    the server): ``wrap`` puts it around the control plane's ASGI app; ``demand``, ``sinks`` and ``wake`` connect it
    to the serving controller; ``close`` at the end. The default serves no gateway."""

    wrap: Callable[[Any], Any] = lambda app: app
    demand: DemandSource | None = None
    sinks: Sequence[ReplicaSink] = ()
    wake: threading.Event | None = None
    close: Callable[[], None] = lambda: None
    collectors: Sequence[Collector] = ()  # its metrics, served at /metrics
    # (workload id, attempt) -> whether the gateway proved that replica ready; None: running counts as ready
    readiness: Callable[[int, int], bool] | None = None
    window: ModelWindow | None = None  # each model's recent requests, as the gateway answered them


def serve(
    config: UpConfig,
    announce: Callable[[str], None],
    *,
    demo: bool = False,
    serving: Callable[[ServerContext], ServingFront] | None = None,
) -> None:
    """Run until SIGINT/SIGTERM. With ``demo``, submit the demo mix once ready and stop its workloads at the end.
    ``serving`` builds the gateway in front of the models (none without it)."""
    if (crash := check_environment()) is not None:  # an unknown crash point is refused here, not ignored
        log.warning("fault injection: this server kills itself at %s (visit %d)", crash.point, crash.nth)
    if (failure := check_failures()) is not None:
        log.warning("fault injection: this server fails once at %s (visit %d)", failure.point, failure.nth)
    mode = run_as_mode(config.run_as)
    homes_inside = config.homes.resolve().is_relative_to(config.data_dir.resolve())
    make_private(config.data_dir, homes_inside=mode == "tenant-users" and homes_inside)
    raise_open_files_limit()
    check_port_free(config.host, config.port)
    server = build_server(config)
    log.log(*isolation_notice(mode, config.homes))
    secret = ensure_admin_token(server.ctx.store, config.admin_token, server.ctx.clock())
    pool = server.ctx.pool
    kind = "simulated" if pool.simulated else "NVML"
    gpus = ", ".join(f"{n.gpu_count}x{n.gpu_model}" for n in pool.nodes)
    announce(f"Tessera {config.url}  GPUs ({kind}): {gpus}  store: {server.ctx.store.engine.url.render_as_string()}")
    announce(f"dashboard: {config.url}/ui  API docs: {config.url}/docs")
    loop = server.ctx.loop
    knobs = f" with {', '.join(loop.config.knobs)}" if loop.config.knobs else ""
    announce(
        f"scheduling: policy {loop.preset.name}{knobs}, placement {loop.placement} (GET /v1/config has every knob)"
    )
    setup = server.ctx.serving_setup
    serving_knobs = f" with {', '.join(config.serving_knobs)}" if config.serving_knobs else ""
    announce(
        f"serving: setup {setup.name}{serving_knobs}: router {setup.router}, autoscaler {setup.autoscaler or 'none'}"
        f", late binding {'on' if setup.late_binding else 'off'}, admission {'on' if setup.admission else 'off'}"
    )
    if server.notice:
        announce(f"backend: Ray; {server.notice}")
    for line in (admin_token_notice(secret, config.admin_token), pool.split_notice()):
        if line:
            announce(line)
    thread = start_loop(server)
    front = serving(server.ctx) if serving is not None else ServingFront()
    server.ctx.replica_ready = server.ctx.metrics.states.replica_ready = front.readiness
    for collector in front.collectors:
        server.ctx.metrics.register(collector)
    keeper = ModelCacheKeeper(account_of=server.accounts.account if server.accounts is not None else None)
    server.ctx.model_tiers = keeper.tiers
    server.ctx.metrics.register(keeper.collector())
    plane = ServingPlane(server.ctx, EngineRunner(check_unprivileged=mode == "tenant-users"))
    server.ctx.model_window = front.window
    history = server.ctx.replica_history = ReplicaHistory(server.ctx.clock, plane.desired.get, front.readiness)
    start_controller(
        server.ctx, server.stopping.is_set, front.demand, [*front.sinks, keeper, history], front.wake,
        tick_s=setup.tick_s, plane=plane, readiness=front.readiness, setup=setup,
    )  # fmt: skip
    if demo:
        token, _ = create_tenant_token(server.ctx.store, DEMO_TENANT, "demo", server.ctx.clock())
        gpu_count = sum(n.gpu_count for n in pool.nodes)
        threading.Thread(target=submit_demo, args=(config.url, token, gpu_count, announce), daemon=True).start()
    app = front.wrap(server.app)
    uv = uvicorn.Server(uvicorn.Config(app, host=config.host, port=config.port, log_level="warning"))
    server.ctx.closing = lambda: uv.should_exit  # event streams end when a shutdown begins
    if threading.current_thread() is threading.main_thread():
        # uvicorn shuts down on SIGTERM, then restores this handler and raises the signal again: with the default
        # one the process would die there, before the cleanup below (loop joined, backend closed).
        signal.signal(signal.SIGTERM, _exit_cleanly)
    try:
        uv.run()
    finally:
        server.stopping.set()
        thread.join(timeout=30)
        for close in server.closers:
            close()
        if demo:
            stop_tenant_workloads(server, DEMO_TENANT)
        server.backend.close()
        front.close()


def admin_token_notice(generated: str | None, given: str | None) -> str | None:
    """What ``tessera up`` says about the admin token: the generated one (shown once), or, on a later start of the
    same store without one given, how to get one (the stored one is kept as a hash and cannot be shown)."""
    if generated is not None:
        return f"admin token (shown once, stored hashed): {generated}"
    if given is None:
        return (
            "admin token: the one made at this store's first start is kept (stored hashed, not shown again); to use a "
            "new one, restart with TESSERA_ADMIN_TOKEN=<token> or --admin-token-file FILE (make one with: "
            "python3 -c 'import secrets; print(secrets.token_urlsafe(32))'); earlier admin tokens are then revoked"
        )
    return None


def check_port_free(host: str, port: int) -> None:
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise InvalidRequestError("--port", f"cannot listen on {host}:{port}: {exc.strerror}") from None


def stop_tenant_workloads(server: Server, tenant: str, grace_s: float = 3.0) -> None:
    """Delete ``tenant``'s models, cancel every active workload of it and wait (bounded) until their processes are
    gone. (Called once the serving controller has stopped: the deleted models are forgotten at the next start.)"""
    store, loop = server.ctx.store, server.ctx.loop
    for model in served.models(store, tenant):
        served.mark_deleting(store, model.id)
    for row in store.list_workloads(tenant=tenant, states=("pending", "running"), limit=10_000):
        store.request_cancel(row.id, server.ctx.clock())
    deadline = time.monotonic() + grace_s + 5
    loop.config = dataclasses.replace(loop.config, stop_grace_s=grace_s)
    while time.monotonic() < deadline and any(e.row.tenant == tenant for e in loop.running.values()):
        loop.step()
        time.sleep(0.2)
