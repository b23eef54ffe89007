"""The Ray backend: Tessera decides (node, GPU, share, isolation, preemption), Ray only runs the process there.

- **Nodes** come from the cluster (``nodes.py``): every alive Ray node is a Tessera node, its GPUs the
  ``tessera/<UUID>`` resources it declares. ``nodes()`` and ``inventory()`` read ``ray.nodes()`` each time, so
  nodes that join or leave show up at the next call.
- **Launch** creates one detached, named actor per workload (``actor.py``) in ``namespace``, named
  ``tessera-<workload id>``, pinned to the chosen node with a hard ``NodeAffinitySchedulingStrategy``, asking
  ``spec.cpu_milli`` CPUs and, per chosen GPU, the granted share of its resource; ``num_gpus`` stays 0. The actor
  starts the workload under the guard (``guard.py``) with the same clean environment and isolation variables as
  the local backend.
- **Poll**: one outstanding ``progress`` call per workload, all waited on with one ``ray.wait(timeout=0)``; each
  answer appends the new log bytes to the workload's log on this host (``LaunchSpec.log_path``: ``tessera logs -f``
  reads it as with the local backend) and, at the end, carries the exit code. Then the actor removes its files and
  exits, and the end is reported once. A gang's launch (``LaunchSpec.gang``: its ranks on this node, under one
  supervisor as on the local backend) asks ``progress_ranks`` instead, and each rank's bytes go to its
  ``rank_log_path`` here (the ranks that log apart are in the handle, ``log_ranks``, for a server that adopts it).
- **Stop** asks the guard for SIGTERM now and SIGKILL after the grace; the guard keeps the deadline itself, so it
  holds while no server is up.
- **Lost actor or node**: an actor that died (``ray.kill``, its node removed) ends with exit code None (unknown),
  which the server's end policy turns into failed (or requeued/restarted, as for any such end). Its guard saw the
  pipe close and killed the whole workload, so a requeued workload never runs twice.
- **Re-adoption**: the handle names the actor; ``adopt`` and ``find`` look it up by name (``ray.get_actor``), so a
  server killed with ``kill -9`` and restarted picks up the same processes; an end written meanwhile is kept by the
  guard's exit file and reported at the first poll.

``pids`` is empty: the processes run on other hosts, where this server's NVML watchdog cannot see them.
Thread-safe: one lock guards the watches (API threads call ``stop`` while the loop polls).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ray
from ray.exceptions import ActorUnavailableError, GetTimeoutError, RayActorError, RayError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from tessera.backends import capped_log
from tessera.backends.base import Backend, BackendNode, ExitStatus, Handle, JsonScalar, LaunchSpec, rank_log_path
from tessera.backends.ray.actor import WorkloadActor
from tessera.backends.ray.nodes import RayNode, alive_nodes, gpu_resource
from tessera.core.errors import InvalidRequestError, TesseraError

logger = logging.getLogger(__name__)

KIND = "ray"
DEFAULT_NAMESPACE = "tessera"
DEFAULT_NODE_DIR = "/tmp/tessera-ray"  # on each node: the workloads' node-local files
PROGRESS_WAIT_S = 1.0  # how long one progress call waits for news (one outstanding per workload)
ACTOR_CONCURRENCY = 4  # progress, stop and cleanup served side by side
LOOKUP_TIMEOUT_S = 30.0
MILLI = 1000


def actor_name(workload_id: str) -> str:
    """The deterministic name of a workload's actor."""
    return f"tessera-{workload_id}"


@dataclass(slots=True)
class _Watch:
    actor: Any  # ray.actor.ActorHandle
    handle: Handle
    log_path: Path | None
    log_max_bytes: int  # its cap (capped_log): this server writes the log, as the actor sends it
    call: Any  # the outstanding progress call (ray.ObjectRef)
    offset: int = 0  # log bytes received so far
    cleaning: bool = False  # ended: ``call`` is the actor's cleanup, the end is reported once it is done
    exit_code: int | None = None
    log: capped_log.CappedLog | None = None  # the log's one writer, from the first bytes to the end (``close_log``)
    rank_offsets: dict[int, int] = field(default_factory=dict)  # a gang's ranks that log apart: bytes received
    rank_logs: dict[int, capped_log.CappedLog] = field(default_factory=dict)  # and their writers

    def append_log(self, chunk: bytes, rank: int = 0) -> None:
        """Appends what the actor sent to the log (rank 0) or a rank's log under its cap (a character split between
        two answers is held until its end comes, as the supervisor's pipe does)."""
        if rank == 0:
            self.offset += len(chunk)
        else:
            self.rank_offsets[rank] += len(chunk)
        if self.log_path is None:
            return
        path = rank_log_path(self.log_path, rank)
        try:
            log = self.log if rank == 0 else self.rank_logs.get(rank)
            if log is None:
                path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
                log = capped_log.CappedLog(path, self.log_max_bytes)
                if rank == 0:
                    self.log = log
                else:
                    self.rank_logs[rank] = log
            log.write(chunk)
        except OSError as error:
            logger.warning("%s: cannot write its log %s: %s", self.handle.workload_id, path, error)

    def close_log(self) -> None:
        for log in (self.log, *self.rank_logs.values()):
            if log is not None:
                log.close()
        self.log = None
        self.rank_logs.clear()

    def ask_progress(self, wait_s: float) -> None:
        """Submits the next progress call (``progress_ranks`` for a gang whose ranks log apart)."""
        if self.rank_offsets:
            self.call = self.actor.progress_ranks.remote({0: self.offset, **self.rank_offsets}, wait_s)
        else:
            self.call = self.actor.progress.remote(self.offset, wait_s)


class RayBackend:
    """``Backend`` over a Ray cluster; ``connect`` it with the cluster's address ("auto" or ``host:port``)."""

    kind = KIND

    def __init__(
        self,
        address: str | None,
        *,
        namespace: str = DEFAULT_NAMESPACE,
        node_dir: str = DEFAULT_NODE_DIR,
        progress_wait_s: float = PROGRESS_WAIT_S,
    ) -> None:
        """Joins the cluster at ``address`` as a driver (reusing a connection this process already has)."""
        self.namespace = namespace
        self.node_dir = node_dir
        self.progress_wait_s = progress_wait_s
        if not ray.is_initialized():
            ray.init(address=address, namespace=namespace, log_to_driver=False, logging_level=logging.WARNING)
        self._remote = ray.remote(WorkloadActor)
        self._lock = threading.Lock()
        self._watches: dict[str, _Watch] = {}

    # ------------------------------------------------------------------------------------------------ the cluster

    def inventory(self) -> list[RayNode]:
        """The alive nodes with their CPUs, memory and declared GPUs, now."""
        return alive_nodes(ray.nodes())  # type: ignore[no-untyped-call]

    def nodes(self) -> list[BackendNode]:
        return [BackendNode(node.name, node.address) for node in self.inventory()]

    # ------------------------------------------------------------------------------------------------ lifecycle

    def launch(self, spec: LaunchSpec) -> Handle:
        """Creates the workload's actor on its node; returns at once (a start failure is reported by ``poll``)."""
        if not spec.argv:
            raise InvalidRequestError("argv", "the command is empty")
        if spec.gang_parts:  # not yet: a gang's ranks start on one node
            hosts = ", ".join(sorted({part.node for part in spec.gang_parts}))
            raise InvalidRequestError("gang_parts", f"a gang's ranks start on one node only (not yet also on {hosts})")
        node = self._node(spec)
        elsewhere = sorted({share.uuid for share in spec.gpus} - set(node.gpu_uuids))
        if elsewhere:  # its actor could never be scheduled: refuse instead of waiting forever
            raise InvalidRequestError("gpus", f"{spec.workload_id}: GPUs {elsewhere} are not on node {node.name}")
        resources = {gpu_resource(share.uuid): share.milli / MILLI for share in spec.gpus if share.milli > 0}
        with self._lock:
            if spec.workload_id in self._watches:
                raise InvalidRequestError("workload_id", f"{spec.workload_id!r} is already running")
        name = actor_name(spec.workload_id)
        log_path = "" if spec.log_path is None else str(spec.log_path)
        workdir = None if spec.workdir is None else str(spec.workdir)
        try:
            actor = self._remote.options(
                name=name,
                namespace=self.namespace,
                lifetime="detached",
                max_restarts=0,
                max_concurrency=ACTOR_CONCURRENCY,
                num_cpus=spec.cpu_milli / MILLI,
                num_gpus=0,
                resources=resources,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node.node_id, soft=False),
            ).remote(spec.workload_id, list(spec.argv), dict(spec.env), workdir, self.node_dir, log_path, spec.gang)
        except ValueError as error:  # the name is taken: a workload of this id runs already
            raise InvalidRequestError("workload_id", f"{spec.workload_id!r}: {error}") from None
        data: dict[str, JsonScalar] = {"namespace": self.namespace, "actor": name, "node": node.name}
        data["node_id"], data["log_path"], data["log_max_bytes"] = node.node_id, log_path, spec.log_max_bytes
        if spec.gang is not None:
            data["log_ranks"] = ",".join(str(rank) for rank in spec.gang.ranks if rank != 0)
        handle = Handle(spec.workload_id, KIND, data)
        with self._lock:
            self._watches[spec.workload_id] = self._watch(actor, handle, 0)
        logger.info(
            "launched %s on Ray node %s (%s) with %s", spec.workload_id, node.name, node.node_id[:12], resources
        )
        return handle

    def adopt(self, handle: Handle) -> None:
        """Tracks the actor the handle names; one that is gone is reported ended (exit code unknown) by ``poll``."""
        namespace, name = _names(handle)
        with self._lock:
            if handle.workload_id in self._watches:
                return
        log_path = handle.data.get("log_path")
        path = Path(log_path) if isinstance(log_path, str) and log_path else None
        offset = capped_log.logical_size(path) if path is not None else 0  # rotated bytes count: the actor's offset
        try:
            actor = ray.get_actor(name, namespace=namespace)
            watch = self._watch(actor, handle, offset, adopted=True)
        except ValueError:  # no such actor: it died (its node was lost) while no server watched
            logger.warning("adopt: %s has no actor %s any more; its end is unknown", handle.workload_id, name)
            watch = _Watch(None, handle, path, _log_max_bytes(handle), ray.put(None), offset)
        with self._lock:
            self._watches.setdefault(handle.workload_id, watch)
        logger.info("adopted %s (actor %s)", handle.workload_id, name)

    def find(self, workload_id: str) -> Handle | None:
        """The handle of a workload whose actor exists (launched by this or an earlier server, end not reported)."""
        with self._lock:
            watch = self._watches.get(workload_id)
        if watch is not None:
            return watch.handle
        try:
            actor = ray.get_actor(actor_name(workload_id), namespace=self.namespace)
            described: Any = ray.get(actor.describe.remote(), timeout=LOOKUP_TIMEOUT_S)
            node = str(described["node_id"])
        except ValueError:
            return None
        except RayError as error:
            logger.warning("find: the actor of %s does not answer (%s); treating it as not found", workload_id, error)
            return None
        names = {n.node_id: n.name for n in self.inventory()}
        data: dict[str, JsonScalar] = {"namespace": self.namespace, "actor": actor_name(workload_id)}
        data.update(node=names.get(node, ""), node_id=node, log_path=described["log_path"])
        if described.get("log_ranks"):  # a gang's launch (an actor of an older Tessera does not say)
            data["log_ranks"] = str(described["log_ranks"])
        return Handle(workload_id, KIND, data)

    def runtime_dir(self, workload_id: str) -> Path | None:
        return None  # workloads run on other nodes, as the server's user: no private directory there (docs/ray.md)

    def private_network(self) -> bool:
        return False

    def forget(self, workload_id: str) -> None:
        """Nothing to drop: the actor removed its files and exited before ``poll`` reported its end (so, unlike the
        local backend's, a reported end is not found again by a server that died before it stored the end)."""

    def pids(self, handle: Handle) -> list[int]:
        _names(handle)
        return []

    def stop(self, workload_id: str, grace_s: float) -> None:
        """SIGTERM now and SIGKILL after ``grace_s``, both by the guard; returns at once."""
        with self._lock:
            watch = self._watches.get(workload_id)
        if watch is None or watch.actor is None:
            logger.debug("stop: %s is not running", workload_id)
            return
        watch.actor.stop.remote(max(grace_s, 0.0))

    def poll(self) -> list[ExitStatus]:
        with self._lock:
            watches = list(self._watches.values())
        if not watches:
            return []
        calls = [watch.call for watch in watches]
        ready, _ = ray.wait(calls, num_returns=len(calls), timeout=0, fetch_local=True)
        done = {id(call) for call in ready}
        ended: list[ExitStatus] = []
        for watch in watches:
            if id(watch.call) in done:
                status = self._advance(watch)
                if status is not None:
                    ended.append(status)
                    watch.close_log()
        with self._lock:
            for status in ended:
                self._watches.pop(status.workload_id, None)
        for status in ended:
            logger.info("%s ended with exit code %s", status.workload_id, status.exit_code)
        return ended

    def tracked(self) -> set[str]:
        with self._lock:
            return set(self._watches)

    def close(self) -> None:
        """Stops watching and leaves the cluster; the actors (and workloads) keep running."""
        with self._lock:
            watches = list(self._watches.values())
            self._watches.clear()
        for watch in watches:
            watch.close_log()

    def shutdown(self) -> None:
        """``close`` and disconnect this process from Ray."""
        self.close()
        ray.shutdown()

    # ------------------------------------------------------------------------------------------------ internals

    def _node(self, spec: LaunchSpec) -> RayNode:
        nodes = {node.name: node for node in self.inventory()}
        if spec.node is None:
            raise InvalidRequestError("node", f"{spec.workload_id}: the Ray backend needs the node Tessera chose")
        node = nodes.get(spec.node)
        if node is None:
            raise TesseraError(f"{spec.workload_id}: Ray node {spec.node!r} is not in the cluster (lost?)")
        return node

    def _watch(self, actor: Any, handle: Handle, offset: int, adopted: bool = False) -> _Watch:
        """The watch of ``actor``, its first progress call submitted: from ``offset`` in the log, and in the logs of
        a gang's ranks that log apart from 0 at the launch, from what their files here hold when ``adopted``."""
        log_path = handle.data.get("log_path")
        path = Path(log_path) if isinstance(log_path, str) and log_path else None
        received = {
            rank: capped_log.logical_size(rank_log_path(path, rank)) if adopted and path is not None else 0
            for rank in _log_ranks(handle)
        }
        watch = _Watch(actor, handle, path, _log_max_bytes(handle), None, offset, rank_offsets=received)
        watch.ask_progress(self.progress_wait_s)
        return watch

    def _advance(self, watch: _Watch) -> ExitStatus | None:
        """The answer of ``watch``'s progress call: log bytes appended; its end, or the next call submitted."""
        if watch.actor is None:  # adopted without an actor: gone while no server watched
            return ExitStatus(watch.handle.workload_id, None)
        if watch.cleaning:  # its actor has removed its files and exited: ``find`` no longer finds it
            return ExitStatus(watch.handle.workload_id, watch.exit_code)
        try:
            answer, code, ended = ray.get(watch.call, timeout=0)
        except ActorUnavailableError:  # not known dead yet (a node that may come back): ask again
            watch.ask_progress(self.progress_wait_s)
            return None
        except (RayActorError, GetTimeoutError, RayError) as error:
            logger.warning("%s: its actor is gone (%s)", watch.handle.workload_id, type(error).__name__)
            return ExitStatus(watch.handle.workload_id, None)
        chunks: dict[int, bytes] = answer if watch.rank_offsets else {0: answer}
        for rank, chunk in chunks.items():
            if chunk and (rank == 0 or rank in watch.rank_offsets):
                watch.append_log(chunk, rank)
        if not ended:
            watch.ask_progress(self.progress_wait_s)
            return None
        watch.call, watch.cleaning, watch.exit_code = watch.actor.cleanup.remote(), True, code
        return None


def _log_max_bytes(handle: Handle) -> int:
    """The log cap its launch was given (a handle stored before caps were sent along: the default)."""
    value = handle.data.get("log_max_bytes")
    return value if isinstance(value, int) and not isinstance(value, bool) else capped_log.DEFAULT_LOG_MAX_BYTES


def _log_ranks(handle: Handle) -> tuple[int, ...]:
    """The ranks of a gang's launch that log apart (``log_ranks``: "1,2"); none for a plain workload."""
    value = handle.data.get("log_ranks")
    if not isinstance(value, str) or not value:
        return ()
    try:
        return tuple(int(rank) for rank in value.split(","))
    except ValueError:
        logger.warning(
            "%s: log_ranks %r is not a list of ranks; its ranks' logs are not read", handle.workload_id, value
        )
        return ()


def _names(handle: Handle) -> tuple[str, str]:
    namespace, name = handle.data.get("namespace"), handle.data.get("actor")
    if handle.backend != KIND or not isinstance(namespace, str) or not isinstance(name, str):
        raise InvalidRequestError("handle", f"{handle.workload_id}: not a Ray backend's handle: {dict(handle.data)}")
    return namespace, name


if TYPE_CHECKING:  # mypy checks that the class satisfies the seam

    def _as_backend(backend: RayBackend) -> Backend:
        return backend
