"""The serving controller's view of the control plane (``serving.controller.ControlPlane``): deployed models from
the store, replicas submitted and cancelled as ``service`` workloads of the model's tenant, through the very path a
``POST /v1/workloads`` takes (validated, queued, placed by the core scheduler, counted against the quota).

A replica listens on a Unix socket in its private runtime directory (``engine_exec --socket``) when the backend
gives workloads one (the local backend); else, where the backend picks ports on the replica's node (Ray: replicas
run on any node), on that node's address and port, requiring a key made here for that replica alone (in its
environment, never on a command line; the gateway sends it); else on a loopback TCP port picked here. ``replicas``
tells the gateway each one's address (and key). Its engine shim runs with the interpreter ``EngineRunner`` found
that the tenant's OS user can run.

``start_controller`` runs the controller on its own thread beside the scheduler loop (``tessera up``).
"""

from __future__ import annotations

import logging
import secrets
import socket
import threading
from collections.abc import Callable, Sequence

from tessera.api import WorkloadSpec
from tessera.server.context import ServerContext
from tessera.server.engine_runner import EngineRunner
from tessera.server.store import served
from tessera.server.store.models import ServedModelRow, WorkloadRow
from tessera.server.submit import Principal, workload_row
from tessera.serving.controller import Controller, ControlPlane, DemandSource, ReplicaSink, ReplicaView
from tessera.serving.engine_exec import KEY_ENV, SOCKET_NAME
from tessera.serving.engine_settings import EngineSettings
from tessera.serving.replica_health import ModelHealth, ReplicaEnd
from tessera.serving.replicas import PORT_ENV, DeployedModel, ReplicaRunner, replica_command
from tessera.serving.setups import PolicySetup

log = logging.getLogger(__name__)

# The priority class a replica runs at, by the model's SLO class: serving outranks training, batch serving does not.
PRIORITY_OF_SLO = {"interactive": "inference-critical", "standard": "inference-critical", "batch": "training"}


def deployed(row: ServedModelRow) -> DeployedModel:
    return DeployedModel(
        id=row.id,
        name=row.name,
        tenant=row.tenant,
        queue=row.queue,
        engine=row.engine,
        weights=row.weights,
        gpus=row.num_gpus,
        gpu_milli=row.gpu_milli,
        gpu_mem_mib=row.gpu_mem_mib,
        min_replicas=row.min_replicas,
        max_replicas=row.max_replicas,
        idle_timeout_s=row.idle_timeout_s,
        slo=row.slo,
        router=row.router,
        autoscaler=row.autoscaler,
        deleting=row.deleting,
        created_s=row.created_at,
        engine_settings=engine_settings(row),
    )


def engine_settings(row: ServedModelRow) -> EngineSettings:
    """The model's own engine settings (none for a model stored before revision 0009)."""
    return EngineSettings(
        tuple(row.engine_args or ()), row.cpu_milli or 0, row.cpu_bind or "", row.kv_offload_gib or 0.0,
        bool(row.kv_events),
    )  # fmt: skip


def replica_port(row: WorkloadRow) -> int | None:
    text = (row.env or {}).get(PORT_ENV, "")
    return int(text) if text.isdigit() else None


def node_url(host: str, port: int) -> str:
    """The base URL of a replica at ``host``:``port`` (an IPv6 address in brackets)."""
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the engine binds it moments later): for a backend without runtime
    directories only."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def replica_key(row: WorkloadRow) -> str | None:
    """The key a replica on a port of its node requires (None: it listens on a socket or a loopback port)."""
    return (row.env or {}).get(KEY_ENV) or None


def replica_spec(
    model: DeployedModel, port: int | None, runner: ReplicaRunner | None = None, api_key: str | None = None
) -> WorkloadSpec:
    """The workload one replica of ``model`` is: what ``POST /v1/workloads`` would take for it (listening on its
    runtime directory's socket when ``port`` is None; with ``api_key``, on a port of its node, requiring it)."""
    command, env = replica_command(model, port, runner=runner, api_key=api_key)
    return WorkloadSpec(
        command=command,
        env=env,
        name=f"{model.name}-replica",
        kind="service",
        gpus=model.gpus,
        gpu_milli=model.gpu_milli or None,
        gpu_mem=model.gpu_mem_mib or None,
        cpu=f"{model.engine_settings.cpu_milli}m" if model.engine_settings.cpu_milli else None,
        priority=PRIORITY_OF_SLO.get(model.slo, "inference-critical"),
        queue=model.queue,
    )


def replica_row(
    model: DeployedModel,
    port: int | None,
    ctx: ServerContext,
    now_s: float,
    runner: ReplicaRunner | None = None,
    api_key: str | None = None,
) -> WorkloadRow:
    """The stored workload of one replica, validated as any submission is (the queue, the pool)."""
    principal = Principal(model.tenant, is_admin=False)
    spec = replica_spec(model, port, runner, api_key)
    row = workload_row(spec, principal, ctx.store.queues(), ctx.pool, now_s)
    row.model_id = model.id
    return row


def last_log_line(ctx: ServerContext, workload_id: int) -> str:
    """The last non-empty line of a workload's log (what an engine said last before it died; rotated logs read as
    one), at most 300 characters."""
    try:
        read = ctx.logs.read(workload_id, ctx.logs.tail_offset(workload_id, 3), 8192, finished=True)
    except OSError:
        return ""
    lines = [line.strip() for line in read.data.decode("utf-8", "replace").splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


def replica_owns(ctx: ServerContext, workload_id: int, pid: int) -> bool:
    """Whether process ``pid`` is one of replica ``workload_id``'s own (its proof of identity to the gateway)."""
    entry = ctx.loop.running.get(workload_id)
    if entry is None or entry.handle is None:
        return False
    return pid in ctx.loop.backend.pids(entry.handle)


class ServingPlane(ControlPlane):
    def __init__(self, ctx: ServerContext, runner: EngineRunner | None = None) -> None:
        self.ctx = ctx
        self.runner = runner or EngineRunner(check_unprivileged=False)
        # Replicas listen on their runtime directory's socket where the backend makes one (any id tells), else on a
        # port of their node where the backend picks one there, else on a loopback port.
        self.sockets = ctx.loop.backend.runtime_dir("0") is not None
        self.node_ports = not self.sockets and ctx.loop.backend.node_ports()
        self.desired: dict[int, int] = {}  # model id -> the autoscaler's target at the last tick (replica history)

    def address(self, row: WorkloadRow) -> str | None:
        """Where replica ``row`` listens: its loopback port's URL, its node's address and port (once the backend
        knows them), or its private socket."""
        port = replica_port(row)
        if port is not None:
            return f"http://127.0.0.1:{port}"
        if replica_key(row) is not None:
            entry = self.ctx.loop.running.get(row.id)
            listen = (
                None if entry is None or entry.handle is None else self.ctx.loop.backend.listen_address(entry.handle)
            )
            return None if listen is None else node_url(*listen)
        runtime = self.ctx.loop.backend.runtime_dir(str(row.id))
        return None if runtime is None else f"unix:{runtime / SOCKET_NAME}"

    def models(self) -> list[DeployedModel]:
        return [deployed(row) for row in served.models(self.ctx.store)]

    def replicas(self, models: Sequence[DeployedModel]) -> dict[int, list[ReplicaView]]:
        rows = served.active_replicas(self.ctx.store, [m.id for m in models])
        return {
            model_id: [
                ReplicaView(r.id, r.state == "running", self.address(r), r.cancel_requested, r.attempts, replica_key(r))
                for r in replicas
            ]
            for model_id, replicas in rows.items()
        }

    def start_replica(self, model: DeployedModel) -> int:
        now = self.ctx.clock()
        port = None if self.sockets or self.node_ports else free_port()
        api_key = secrets.token_urlsafe(32) if self.node_ports else None
        runner = ReplicaRunner(self.runner.python(), tuple(self.runner.path))
        row = replica_row(model, port, self.ctx, now, runner, api_key)
        stored = self.ctx.store.add_workload(row, now)
        self.ctx.metrics.replica_starts.labels(model.name).inc()
        self.ctx.loop.wake()
        where = "its private socket" if self.sockets else "a port of its node" if api_key else f"port {port}"
        log.info("model %s: replica workload %d submitted (listening on %s)", model.key, stored.id, where)
        return stored.id

    def stop_replica(self, workload_id: int) -> None:
        self.ctx.store.request_cancel(workload_id, self.ctx.clock())
        self.ctx.loop.wake()

    def record_desired(self, model: DeployedModel, desired: int) -> None:
        served.set_desired(self.ctx.store, model.id, desired)
        self.desired[model.id] = desired

    def forget(self, model: DeployedModel) -> None:
        served.forget(self.ctx.store, model.id)
        self.ctx.model_health.pop(model.id, None)
        self.desired.pop(model.id, None)
        log.info("model %s deleted", model.key)

    def replica_end(self, workload_id: int) -> ReplicaEnd | None:
        row = self.ctx.store.get_workload(workload_id)
        if row is None:
            return None
        return ReplicaEnd(workload_id, row.state, row.reason, last_log_line(self.ctx, row.id))

    def record_health(self, model: DeployedModel, health: ModelHealth) -> None:
        before = self.ctx.model_health.get(model.id)
        self.ctx.model_health[model.id] = health
        failures = health.failures_total - (before.failures_total if before is not None else 0)
        if failures > 0:
            self.ctx.metrics.replica_failures.labels(model.name).inc(failures)
        self.ctx.metrics.model_failing.labels(model.name).set(int(health.failing))
        if health.failing and (before is None or not before.failing):
            log.warning("model %s is failing: %s", model.key, health.last_error)


def start_controller(
    ctx: ServerContext,
    stopping: Callable[[], bool],
    demand: DemandSource | None = None,
    sinks: Sequence[ReplicaSink] = (),
    wake: threading.Event | None = None,
    tick_s: float = 1.0,
    plane: ServingPlane | None = None,
    readiness: Callable[[int, int], bool] | None = None,
    setup: PolicySetup | None = None,
) -> tuple[Controller, threading.Thread]:
    """Run a serving controller every ``tick_s`` (or at once when ``wake`` is set: a request waits for a model
    with no replica) until ``stopping()``; ``readiness``: which replicas the gateway proved ready."""
    controller = Controller(
        plane or ServingPlane(ctx), tick_s=tick_s, sinks=list(sinks), readiness=readiness,
        setup=setup or ctx.serving_setup,
    )  # fmt: skip
    if demand is not None:
        controller.demand = demand
    event = wake if wake is not None else threading.Event()

    def run() -> None:
        while not stopping():
            try:
                controller.tick(ctx.clock())
            except Exception:  # a store hiccup: try again at the next tick
                log.exception("serving controller tick failed")
            event.wait(tick_s)
            event.clear()

    thread = threading.Thread(target=run, name="tessera-serving", daemon=True)
    thread.start()
    return controller, thread
