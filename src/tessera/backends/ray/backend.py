"""The Ray backend: Tessera decides (node, GPU, share, isolation, preemption), Ray only runs the process there.

- **Nodes** come from the cluster (``nodes.py``): every alive Ray node is a Tessera node, its GPUs the
  ``tessera/<UUID>`` resources it declares. ``nodes()`` and ``inventory()`` read ``ray.nodes()`` each time, so
  nodes that join or leave show up at the next call.
- **Launch** creates one detached, named actor per workload (``actor.py``) in ``namespace``, named
  ``tessera-<workload id>``, pinned to the chosen node with a hard ``NodeAffinitySchedulingStrategy``, asking
  ``spec.cpu_milli`` CPUs and, per chosen GPU, the granted share of its resource; ``num_gpus`` stays 0. The actor
  starts the workload under the guard (``guard.py``) with the same clean environment and isolation variables as
  the local backend.
- **Poll**: one outstanding ``progress`` call per actor, all waited on with one ``ray.wait(timeout=0)``; each
  answer appends the new log bytes to the workload's log on this host (``LaunchSpec.log_path``: ``tessera logs -f``
  reads it as with the local backend) and, at the end, carries the exit code. Then the actor removes its files and
  exits, and the end is reported once. A gang's launch (``LaunchSpec.gang``: its ranks on this node, under one
  supervisor as on the local backend) asks ``progress_ranks`` instead, and each rank's bytes go to its
  ``rank_log_path`` here (the ranks that log apart are in the handle, ``log_ranks``, for a server that adopts it).
- **A gang across nodes** (``LaunchSpec.gang_parts``, ``parts.py``): one more actor per other node's part,
  ``tessera-<id>-part<k>``, made alike; rank 0's actor picks ``MASTER_PORT`` on its node (``MASTER_ADDR``: that
  node's address) and tells the parts. One handle names them all; the workload ends once every part ended, with the
  first failure's code, and the first failure stops the other parts (``watch.py``).
- **Stop** asks the guard for SIGTERM now and SIGKILL after the grace; the guard keeps the deadline itself, so it
  holds while no server is up.
- **Lost actor or node**: an actor that died (``ray.kill``, its node removed) ends with exit code None (unknown),
  which the server's end policy turns into failed (or requeued/restarted, as for any such end). Its guard saw the
  pipe close and killed the whole workload, so a requeued workload never runs twice.
- **Re-adoption**: the handle names the actor; ``adopt`` and ``find`` look it up by name (``ray.get_actor``), so a
  server killed with ``kill -9`` and restarted picks up the same processes; an end written meanwhile is kept by the
  guard's exit file and reported at the first poll.

- **A port on the node** (``LaunchSpec.node_port``: a model replica): the actor picks a free port of its node's
  address (``NodeManagerAddress``) before it starts the workload; ``listen_address`` asks it (``listening``) until
  a socket listens there that only the workload's processes hold.

``pids`` is empty: the processes run on other hosts, where this server's NVML watchdog cannot see them.
Thread-safe: one lock guards the watches (API threads call ``stop`` while the loop polls).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ray
from ray.exceptions import RayError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from tessera.backends import capped_log
from tessera.backends.base import (
    Backend,
    BackendNode,
    ExitStatus,
    GpuShare,
    Handle,
    JsonScalar,
    LaunchSpec,
    rank_log_path,
)
from tessera.backends.ray.actor import PartOf, WorkloadActor
from tessera.backends.ray.nodes import RayNode, alive_nodes, gpu_resource
from tessera.backends.ray.parts import (
    PART_FIELDS,
    part_actor_name,
    part_env,
    part_fields,
    part_log_path,
    parts_of,
    plan_parts,
)
from tessera.backends.ray.watch import ActorWatch, WorkloadWatch
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
        self._watches: dict[str, WorkloadWatch] = {}

    # ------------------------------------------------------------------------------------------------ the cluster

    def inventory(self) -> list[RayNode]:
        """The alive nodes with their CPUs, memory and declared GPUs, now."""
        return alive_nodes(ray.nodes())  # type: ignore[no-untyped-call]

    def nodes(self) -> list[BackendNode]:
        return [BackendNode(node.name, node.address) for node in self.inventory()]

    # ------------------------------------------------------------------------------------------------ lifecycle

    def launch(self, spec: LaunchSpec) -> Handle:
        """Creates the workload's actor on its node, and for a gang across nodes one actor per other part on its
        node (``parts.py``); returns at once (a start failure is reported by ``poll``)."""
        if not spec.argv:
            raise InvalidRequestError("argv", "the command is empty")
        nodes = {node.name: node for node in self.inventory()}
        node = self._node(spec, nodes)
        elsewhere = sorted({share.uuid for share in spec.gpus} - set(node.gpu_uuids))
        if elsewhere:  # its actor could never be scheduled: refuse instead of waiting forever
            raise InvalidRequestError("gpus", f"{spec.workload_id}: GPUs {elsewhere} are not on node {node.name}")
        name = actor_name(spec.workload_id)
        parts = plan_parts(spec, node, nodes, name)
        with self._lock:
            if spec.workload_id in self._watches:
                raise InvalidRequestError("workload_id", f"{spec.workload_id!r} is already running")
        log_path = "" if spec.log_path is None else str(spec.log_path)
        workdir = None if spec.workdir is None else str(spec.workdir)
        gang, fields = spec.gang, part_fields(parts)
        if parts and gang is not None:  # MASTER_ADDR: rank 0's node as Ray knows it; its actor picks the port
            gang = replace(gang, master_addr=node.address)
        common = (spec.workload_id, list(spec.argv))
        try:
            actor = self._actor(name, node, spec.cpu_milli, spec.gpus).remote(
                *common, dict(spec.env), workdir, self.node_dir, log_path, gang, fields or None,
                listen_host=node.address if spec.node_port else None,
            )  # fmt: skip
        except ValueError as error:  # the name is taken: a workload of this id runs already
            raise InvalidRequestError("workload_id", f"{spec.workload_id!r}: {error}") from None
        actors = [actor]
        try:
            for ref, part in zip(parts, spec.gang_parts, strict=True):
                part_of = PartOf(ref.index, name, self.namespace, ref.ranks)
                actors.append(
                    self._actor(ref.actor, nodes[ref.node], part.cpu_milli, part.gpus).remote(
                        *common, part_env(spec.env, part), workdir, self.node_dir, log_path, None, None, part_of
                    )
                )
        except (ValueError, RayError) as error:  # a part's name is taken (an earlier run's leftover?)
            for started in actors:  # its guard kills whatever it started
                ray.kill(started, no_restart=True)
            raise InvalidRequestError("gang_parts", f"{spec.workload_id!r}: {error}") from None
        data: dict[str, JsonScalar] = {"namespace": self.namespace, "actor": name, "node": node.name}
        data["node_id"], data["log_path"], data["log_max_bytes"] = node.node_id, log_path, spec.log_max_bytes
        if spec.gang is not None:
            data["log_ranks"] = ",".join(str(rank) for rank in spec.gang.ranks if rank != 0)
        handle = Handle(spec.workload_id, KIND, {**data, **fields})
        with self._lock:
            self._watches[spec.workload_id] = self._watch(handle, actors, adopted=False)
        elsewhere_text = "".join(f", {ref.actor} on {ref.node} (ranks {ref.ranks})" for ref in parts)
        logger.info("launched %s on Ray node %s (%s)%s", spec.workload_id, node.name, node.node_id[:12], elsewhere_text)
        return handle

    def adopt(self, handle: Handle) -> None:
        """Tracks the actors the handle names; one that is gone has ended with exit code unknown, as ``poll`` says
        (a gang across nodes: the others are stopped then, as after any failure)."""
        namespace, name = _names(handle)
        parts = parts_of(handle.workload_id, handle.data)
        with self._lock:
            if handle.workload_id in self._watches:
                return
        actors = [self._lookup(handle.workload_id, namespace, actor) for actor in (name, *(p.actor for p in parts))]
        watch = self._watch(handle, actors, adopted=True)
        with self._lock:
            self._watches.setdefault(handle.workload_id, watch)
        logger.info("adopted %s (actor %s)", handle.workload_id, ", ".join([name, *(p.actor for p in parts)]))

    def find(self, workload_id: str) -> Handle | None:
        """The handle of a workload whose actor exists (launched by this or an earlier server, end not reported);
        a gang across nodes' handle names all its parts, also those whose start was cut short (``adopt``: ended)."""
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
        data.update({key: str(described[key]) for key in PART_FIELDS if described.get(key)})
        return Handle(workload_id, KIND, data)

    def runtime_dir(self, workload_id: str) -> Path | None:
        return None  # workloads run on other nodes, as the server's user: no private directory there (docs/ray.md)

    def private_network(self) -> bool:
        return False

    def node_ports(self) -> bool:
        return True  # the actor picks the port on the workload's node (``actor.py``)

    def listen_address(self, handle: Handle) -> tuple[str, int] | None:
        """Where the workload's actor says it listens, once only the workload listens there (asked without waiting:
        None until it has answered so)."""
        with self._lock:
            watch = self._watches.get(handle.workload_id)
            return None if watch is None else watch.listen_address()

    def forget(self, workload_id: str) -> None:
        """Nothing to drop: the actors removed their files and exited before ``poll`` reported the end (so, unlike
        the local backend's, a reported end is not found again by a server that died before it stored the end)."""

    def pids(self, handle: Handle) -> list[int]:
        _names(handle)
        return []

    def stop(self, workload_id: str, grace_s: float) -> None:
        """SIGTERM now and SIGKILL after ``grace_s``, both by the guards (of every part); returns at once."""
        with self._lock:
            watch = self._watches.get(workload_id)
        if watch is None:
            logger.debug("stop: %s is not running", workload_id)
            return
        watch.stop(grace_s)

    def poll(self) -> list[ExitStatus]:
        with self._lock:
            watches = list(self._watches.values())
        calls = [call for watch in watches for call in watch.calls()]
        done: set[int] = set()
        if calls:
            ready, _ = ray.wait(calls, num_returns=len(calls), timeout=0, fetch_local=True)
            done = {id(call) for call in ready}
        ended: list[ExitStatus] = []
        for watch in watches:
            for actor in watch.actors:
                if actor.call is not None and id(actor.call) in done:
                    actor.advance(self.progress_wait_s)
            status = watch.settle()
            if status is not None:
                ended.append(status)
                watch.close_logs()
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
        """Stops watching; the actors (and workloads) keep running."""
        with self._lock:
            watches = list(self._watches.values())
            self._watches.clear()
        for watch in watches:
            watch.close_logs()

    def shutdown(self) -> None:
        """``close`` and disconnect this process from Ray."""
        self.close()
        ray.shutdown()

    # ------------------------------------------------------------------------------------------------ internals

    def _node(self, spec: LaunchSpec, nodes: dict[str, RayNode]) -> RayNode:
        if spec.node is None:
            raise InvalidRequestError("node", f"{spec.workload_id}: the Ray backend needs the node Tessera chose")
        node = nodes.get(spec.node)
        if node is None:
            raise TesseraError(f"{spec.workload_id}: Ray node {spec.node!r} is not in the cluster (lost?)")
        return node

    def _actor(self, name: str, node: RayNode, cpu_milli: int, gpus: tuple[GpuShare, ...]) -> Any:
        """The actor class, with its options: ``name``, detached, on ``node`` (hard affinity), ``cpu_milli`` CPUs and
        each GPU's share as its resource (``num_gpus`` 0)."""
        return self._remote.options(
            name=name,
            namespace=self.namespace,
            lifetime="detached",
            max_restarts=0,
            max_concurrency=ACTOR_CONCURRENCY,
            num_cpus=cpu_milli / MILLI,
            num_gpus=0,
            resources={gpu_resource(share.uuid): share.milli / MILLI for share in gpus if share.milli > 0},
            scheduling_strategy=NodeAffinitySchedulingStrategy(node.node_id, soft=False),
        )

    def _lookup(self, workload_id: str, namespace: str, name: str) -> Any:
        """The actor named ``name``, or None when there is none (it died, its node was lost, or its start was cut
        short, while no server watched)."""
        try:
            return ray.get_actor(name, namespace=namespace)
        except ValueError:
            logger.warning("adopt: %s has no actor %s any more; its end is unknown", workload_id, name)
            return None

    def _watch(self, handle: Handle, actors: list[Any], adopted: bool) -> WorkloadWatch:
        """The watch of a workload's ``actors`` (its own, then its parts'; None: gone), their first calls submitted:
        each log from what its file here holds when ``adopted``, else from the start."""
        log_path = handle.data.get("log_path")
        path = Path(log_path) if isinstance(log_path, str) and log_path else None
        parts = parts_of(handle.workload_id, handle.data)
        logs = [(0, _log_ranks(handle)), *((part.index, part.ranks) for part in parts)]
        watches: list[ActorWatch] = []
        for actor, (index, ranks) in zip(actors, logs, strict=True):
            destinations: dict[int, Path] = {}
            if path is not None:
                destinations = {0: part_log_path(path, index) if index else path}
                destinations.update({rank: rank_log_path(path, rank) for rank in ranks if rank != 0})
            keys = [0, *(rank for rank in ranks if rank != 0)]
            offsets = {key: capped_log.logical_size(destinations[key]) if adopted and path else 0 for key in keys}
            name = part_actor_name(actor_name(handle.workload_id), index) if index else actor_name(handle.workload_id)
            watch = ActorWatch(handle.workload_id, actor, name, _log_max_bytes(handle), destinations, offsets)
            if actor is None:
                watch.gone()
            else:
                watch.ask_progress(self.progress_wait_s)
            watches.append(watch)
        return WorkloadWatch(handle, watches)


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
