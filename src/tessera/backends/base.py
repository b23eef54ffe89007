"""The backend seam: the nodes a backend runs on, launch a workload, stop it, learn when it ends, re-adopt it after a
server restart.

The server writes every decision to its store *before* it calls the backend, and stores the ``Handle`` that
``launch`` returns (as JSON) so that a restarted server can ``adopt`` workloads that outlived it. A handle is opaque:
the server never reads its ``data``; what it needs of a running workload it asks the backend (``pids``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Protocol

from tessera.backends.capped_log import DEFAULT_LOG_MAX_BYTES

# Where a ``LaunchSpec.node_port`` workload listens, in its environment (``tessera.serving.engine_exec`` reads them).
LISTEN_HOST_ENV = "TESSERA_LISTEN_HOST"
LISTEN_PORT_ENV = "TESSERA_LISTEN_PORT"


@dataclass(frozen=True, slots=True)
class GpuShare:
    """One GPU a workload was placed on and the share of it Tessera granted (1000 = the whole GPU)."""

    uuid: str
    milli: int


@dataclass(frozen=True, slots=True)
class LaunchSpec:
    workload_id: str
    argv: tuple[str, ...]  # the command, argv[0] looked up on PATH
    # The workload's own variables (its env, CUDA_VISIBLE_DEVICES...), on a clean minimal base: never the server's.
    env: Mapping[str, str] = field(default_factory=dict)
    log_path: Path | None = None  # stdout and stderr together; None = discard
    workdir: Path | None = None  # working directory; None = its account's home (tenant users), else the server's
    tenant: str | None = None  # whose it is: a backend may run it as that tenant's OS user
    # Where Tessera placed it: a backend that runs on many nodes (Ray) starts it there with exactly these resources;
    # the local backend has one node and needs none of it. ``node`` as ``GpuDevice.node`` names it.
    node: str | None = None
    gpus: tuple[GpuShare, ...] = ()
    # What it asked for and is held to (the local backend: its cgroup's cpu, memory and pids limits; 0 = none).
    cpu_milli: int = 0  # a CPU quota of cpu_milli / 1000 CPUs, and a weight in proportion
    mem_max_mib: int = 0  # its memory (the request's --mem, else the server's default for its GPU share)
    pids_max: int = 0  # its processes and threads together
    log_max_bytes: int = DEFAULT_LOG_MAX_BYTES  # its log is rotated before a file passes this size (0: never)
    # Run it in a network namespace of its own (loopback only) where the backend can make one; a model replica asks,
    # so that no other tenant reaches the TCP ports its engine opens. ``Backend.private_network`` says if it can.
    private_network: bool = False
    # It serves on a TCP port of its node (a model replica): a backend whose ``node_ports()`` is True (Ray: the
    # replica may run on another host than the server's) picks a free port of the node's address on the node at
    # launch, gives both in ``LISTEN_HOST_ENV`` / ``LISTEN_PORT_ENV``, and tells them back (``listen_address``).
    node_port: bool = False
    # A multi-worker job's ranks on this node (one process each); None: one process (the command itself).
    gang: GangRanks | None = None
    # A gang across hosts: the ranks on other hosts than ``node`` (which runs rank 0). The backend starts them all as
    # this one workload (one handle; its end once every part ended, the first failure's code; a stop stops all),
    # with ``MASTER_ADDR`` the address of ``node`` and one ``MASTER_PORT`` it chooses for all; a backend that runs
    # on one host refuses such a launch (``InvalidRequestError`` naming ``gang_parts``).
    gang_parts: tuple[GangPart, ...] = ()


@dataclass(frozen=True, slots=True)
class GangRanks:
    """The ranks of a multi-worker job (a gang) that one launch runs on its node: one process per rank, started
    together, each with torchrun's variables (``WORLD_SIZE``, ``RANK``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``,
    ``MASTER_ADDR``, ``MASTER_PORT``); every rank sees all the launch's GPUs (``CUDA_VISIBLE_DEVICES``), in local
    rank order, as under torchrun. Rank ``r`` logs to ``rank_log_path(spec.log_path, r)``. The first rank that fails
    stops the others; the launch's exit code is that rank's (0 when every rank exits 0)."""

    world_size: int  # ranks of the whole job
    ranks: tuple[int, ...]  # the global ranks this launch runs, in local rank order (LOCAL_RANK = index)
    master_addr: str = "127.0.0.1"  # where rank 0 runs
    master_port: int = 0  # 0: the launch picks a free port on master_addr (it runs rank 0)

    def __post_init__(self) -> None:
        if self.world_size < 1 or not self.ranks or not all(0 <= r < self.world_size for r in self.ranks):
            raise ValueError(f"bad gang ranks {self.ranks} of {self.world_size}")
        if self.master_port == 0 and 0 not in self.ranks:
            raise ValueError("a launch without rank 0 needs rank 0's master_port")


@dataclass(frozen=True, slots=True)
class GangPart:
    """The ranks of a gang on another host than its launch's own (a gang across hosts, ``LaunchSpec.gang_parts``):
    where they run, their GPUs, their global ranks (in local rank order) and their limits, as ``LaunchSpec`` gives
    them for its own host's ranks."""

    node: str  # as ``GpuDevice.node`` names it
    ranks: tuple[int, ...]
    gpus: tuple[GpuShare, ...] = ()
    cpu_milli: int = 0
    mem_max_mib: int = 0


def rank_log_path(log_path: Path, rank: int) -> Path:
    """Where rank ``rank`` of a gang logs: rank 0 in the workload's log, rank r in ``<log>.rank<r>``."""
    return log_path if rank == 0 else log_path.with_name(f"{log_path.name}.rank{rank}")


JsonScalar = str | int | float | bool | None


@dataclass(frozen=True, slots=True)
class Handle:
    """A launched workload as its backend knows it: opaque to the server, which stores it (``to_json``) and hands it
    back (``from_json``) to ``adopt`` after a restart. Only the backend named ``backend`` reads ``data``."""

    workload_id: str
    backend: str  # the kind of backend that made it ("local", "fake", ...)
    data: Mapping[str, JsonScalar]  # the backend's own fields (the local backend: pid, pgid, start marker, exit file)
    # For people (not part of its identity): what the launch gave it (the local backend: its limits), in its events.
    note: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        for key, value in self.data.items():
            if not isinstance(key, str) or not isinstance(value, str | int | float | bool | None):
                raise ValueError(f"handle data must map names to JSON scalars, not {key!r}: {value!r}")
        object.__setattr__(self, "data", MappingProxyType(dict(self.data)))

    def to_json(self) -> dict[str, Any]:
        value = {"workload_id": self.workload_id, "backend": self.backend, "data": dict(self.data)}
        return {**value, "note": self.note} if self.note else value

    @classmethod
    def from_json(cls, value: Any) -> Handle:
        """The handle ``to_json`` wrote; raises ``ValueError`` for anything else."""
        if not isinstance(value, Mapping) or set(value) - {"note"} != {"workload_id", "backend", "data"}:
            raise ValueError(f"not a backend handle: {value!r}")
        workload_id, backend, data, note = value["workload_id"], value["backend"], value["data"], value.get("note", "")
        if not all(isinstance(v, str) for v in (workload_id, backend, note)) or not isinstance(data, Mapping):
            raise ValueError(f"not a backend handle: {value!r}")
        return cls(workload_id, backend, data, note)


@dataclass(frozen=True, slots=True)
class BackendNode:
    """A node a backend can run workloads on."""

    name: str  # as GPU devices name their node (``GpuDevice.node``): "local" for this host
    address: str  # where it is reached: a host name, a Ray node's IP


@dataclass(frozen=True, slots=True)
class ExitStatus:
    workload_id: str
    exit_code: int | None  # the command's exit code; negative = killed by that signal; None = unknown (vanished)


class Backend(Protocol):
    kind: str  # what its handles say in ``Handle.backend``

    def nodes(self) -> list[BackendNode]:
        """The nodes this backend can run workloads on now."""
        ...

    def launch(self, spec: LaunchSpec) -> Handle:
        """Start the workload; returns at once."""
        ...

    def adopt(self, handle: Handle) -> None:
        """Track a workload launched by an earlier server; if it ended meanwhile, the next ``poll`` reports it.
        Raises ``InvalidRequestError`` for a handle another kind of backend made."""
        ...

    def find(self, workload_id: str) -> Handle | None:
        """The handle of a workload launched earlier whose handle may never have reached the store (the server died
        between launch and write, even between starting the process and noting where it is), or None when it was
        never launched (nothing of it was started) or its end was forgotten since (``forget``). A workload that ran
        and ended meanwhile is found too, also one whose end ``poll`` reported to a server that died before it
        stored it: ``adopt`` its handle and the next ``poll`` reports that end. Recovery asks this before it
        launches anything again, so a launch is never repeated while (or after) the first one ran."""
        ...

    def forget(self, workload_id: str) -> None:
        """The server stored the end that ``poll`` reported of ``workload_id`` (or binds it anew, its last end
        stored): drop what ``find`` would still find of that launch. A no-op for a workload this backend runs."""
        ...

    def runtime_dir(self, workload_id: str) -> Path | None:
        """The workload's private runtime directory on its node (``TESSERA_RUNTIME_DIR`` in its environment: only
        its own OS user and the server can enter it; made at launch, removed at its end), or None when this backend
        gives workloads none."""
        ...

    def private_network(self) -> bool:
        """Whether ``LaunchSpec.private_network`` is honoured (a network namespace of the workload's own)."""
        ...

    def node_ports(self) -> bool:
        """Whether ``LaunchSpec.node_port`` is honoured (a port picked on the workload's node, ``listen_address``)."""
        ...

    def listen_address(self, handle: Handle) -> tuple[str, int] | None:
        """Where a ``LaunchSpec.node_port`` workload listens: (its node's address, the port picked there), or None
        while that is not known yet (its start on the node is under way), after its end, or without a port."""
        ...

    def pids(self, handle: Handle) -> list[int]:
        """The workload's live processes on this host (what NVML reports GPU memory by, for the memory watchdog);
        [] when none are left or the workload runs elsewhere."""
        ...

    def stop(self, workload_id: str, grace_s: float) -> None:
        """Ask the workload to stop now (SIGTERM) and force it after ``grace_s`` (SIGKILL); returns at once. Its end
        is reported by ``poll`` like any other."""
        ...

    def poll(self) -> list[ExitStatus]:
        """Workloads that ended since the last call (each reported once; nothing of theirs is left running)."""
        ...

    def tracked(self) -> set[str]:
        """Ids of the workloads this backend still watches."""
        ...

    def close(self) -> None:
        """Stop watching (the server is shutting down); workload processes keep running and can be re-adopted."""
        ...
