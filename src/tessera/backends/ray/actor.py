"""The workload actor: one detached, named Ray actor per workload, on the node Tessera chose, holding its guard.

``RayBackend.launch`` creates it (``ray.remote(WorkloadActor)`` with hard node affinity, the GPU shares as custom
resources, the requested CPUs, ``lifetime="detached"``, a deterministic name in Tessera's namespace), so the
workload survives the server that launched it and a restarted server finds it by name. The actor

- writes the workload's files into a node-local directory (``argv.json``; ``spec.json``: the local backend's
  ``CommandSpec`` with the clean workload environment, which carries Tessera's isolation variables such as
  ``CUDA_VISIBLE_DEVICES``) and starts the guard (``guard.py``) with ``setsid -f``, keeping the write end of the
  pipe the guard watches: when this actor dies for any reason, the guard kills the workload;
- answers ``progress(offset, wait_s)``, a long poll: new log bytes from ``offset`` (the server appends them to the
  workload's log, so ``tessera logs -f`` works as with the local backend) and, once the guard has written it, the
  exit code. The server keeps one such call outstanding per workload and waits on all of them with ``ray.wait``.
  A gang's launch (``GangRanks``) has one node-local log per rank (the supervisor's, ``rank_log_path`` of ``log``,
  uncapped here: the server caps what it appends): ``progress_ranks`` answers for all of them at once;
- in a gang across nodes (``parts.py``): the workload's own actor (rank 0's) picks ``MASTER_PORT``, a free port of
  its node's address, before it starts its ranks, and tells each part's actor its ranks with that address and port
  (``part_gang``); a part's actor asks it so (``PartOf``) before it starts its own, so every rank has the same
  ``MASTER_ADDR`` and ``MASTER_PORT`` and no part starts before the port is chosen. A part's directory is
  ``<id>.part<k>``; its supervisor's own messages are its main log (0), its ranks log apart;
- for a workload that serves on its node (``LaunchSpec.node_port``: a model replica), picks a free port of the node's
  address before it starts the workload, gives both in its environment (``TESSERA_LISTEN_HOST``,
  ``TESSERA_LISTEN_PORT``) and tells them in ``describe``; ``listening`` tells them only once a socket listens
  there that none but the workload's processes hold (how the server learns where the replica listens, proven);
- passes ``stop(grace_s)`` and ``kill()`` to the guard;
- ``cleanup()`` removes its directory and exits, once the server has recorded the end.

Threaded (``max_concurrency``): ``stop`` is served while a ``progress`` call waits.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from tessera.backends.accounts import server_account, workload_env
from tessera.backends.base import LISTEN_HOST_ENV, LISTEN_PORT_ENV, GangRanks, rank_log_path
from tessera.backends.gang_ranks import pick_master_port
from tessera.backends.listeners import listens_only
from tessera.backends.local_files import file_stem
from tessera.backends.procfs import all_pids, is_gone, read_proc_stat
from tessera.backends.ray import guard
from tessera.backends.supervisor import CommandSpec

MAX_CHUNK_BYTES = 1 << 20  # at most this much log per progress answer
WORKLOAD_UMASK = 0o022
GUARD_MODULE = "tessera.backends.ray.guard"
PORT_WAIT_S = 300.0  # how long a part's actor waits for rank 0's actor to tell it the port (it may wait for room)


@dataclass(frozen=True, slots=True)
class PartOf:
    """A part of a gang across nodes: its place (1, 2, ...), its workload actor's name and namespace, its ranks."""

    index: int
    master: str
    namespace: str
    ranks: tuple[int, ...]


def workload_dir(base_dir: str, workload_id: str, part: int = 0) -> Path:
    """The node-local directory of a workload's actor (of its part ``part`` of a gang across nodes: ``.part<k>``)."""
    return Path(base_dir) / (file_stem(workload_id) + (f".part{part}" if part else ""))


class WorkloadActor:
    """See the module's doc. Created only through ``ray.remote``; ``spec_env`` is the workload's own variables."""

    def __init__(
        self,
        workload_id: str,
        argv: list[str],
        spec_env: Mapping[str, str],
        workdir: str | None,
        base_dir: str,
        log_path: str,
        gang: GangRanks | None = None,
        parts: Mapping[str, str] | None = None,
        part_of: PartOf | None = None,
        listen_host: str | None = None,
    ) -> None:
        """``parts``: the handle's fields naming a gang's other parts (this actor runs rank 0, and picks the port
        for all); ``part_of``: this actor runs such a part (its ranks' gang comes from rank 0's actor);
        ``listen_host``: the workload serves on a port of this node's address (``LaunchSpec.node_port``), picked
        here before it starts and given in its environment."""
        self.workload_id = workload_id
        self.listen: tuple[str, int] | None = None
        if listen_host is not None:
            self.listen = (listen_host, pick_master_port(listen_host))
            spec_env = {**spec_env, LISTEN_HOST_ENV: listen_host, LISTEN_PORT_ENV: str(self.listen[1])}
        self.log_path = log_path  # on the server's host: told back to a server that finds this actor
        self.parts = dict(parts or {})
        if gang is not None and self.parts and gang.master_port == 0:  # one port for every part, chosen first
            gang = replace(gang, master_port=pick_master_port(gang.master_addr))
        if part_of is not None:
            gang = _gang_from_master(part_of)
        self.gang = gang
        self.dir = workload_dir(base_dir, workload_id, 0 if part_of is None else part_of.index)
        shutil.rmtree(self.dir, ignore_errors=True)  # an earlier run of the same id: its files are not ours
        self.dir.mkdir(mode=0o700, parents=True)
        account = server_account()
        cwd = workdir if workdir is not None and Path(workdir).is_dir() else "/"
        # A gang's ranks log apart (the supervisor's pipes need the log named): the main log is uncapped, as without.
        log = None if gang is None else str(self.dir / guard.LOG_FILE)
        self.log_ranks = "" if gang is None else ",".join(str(rank) for rank in gang.ranks if rank != 0)
        spec = CommandSpec(env=workload_env(account, spec_env), cwd=cwd, umask=WORKLOAD_UMASK, log=log, gang=gang)
        _write_private(self.dir / guard.SPEC_FILE, json.dumps(spec.to_json()))
        (self.dir / guard.ARGV_FILE).write_text(json.dumps(list(argv)))
        read_fd, self._write_fd = os.pipe()
        try:
            subprocess.run(
                ["setsid", "-f", sys.executable, "-s", "-P", "-m", GUARD_MODULE, str(self.dir), str(read_fd)],
                pass_fds=(read_fd,),
                stdin=subprocess.DEVNULL,
                cwd="/",
                env={k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "PYTHONPATH")},
                check=True,
                timeout=30,
            )
        finally:
            os.close(read_fd)

    def describe(self) -> dict[str, str]:
        """What a restarted server needs to adopt this workload."""
        import ray  # only inside a running actor

        node_id = str(ray.get_runtime_context().get_node_id())
        described = {"workload_id": self.workload_id, "log_path": self.log_path, "dir": str(self.dir)}
        if self.listen is not None:
            described |= {"listen_host": self.listen[0], "listen_port": str(self.listen[1])}
        return {**described, "node_id": node_id, "log_ranks": self.log_ranks, **self.parts}

    def listening(self) -> tuple[str, int] | None:
        """Where the workload serves (``listen_host`` and the port picked for it), once a socket listens there that
        only the workload's processes hold (``listeners.listens_only``); None before, or without a port."""
        if self.listen is None:
            return None
        pids = workload_pids(self.dir)
        return self.listen if pids and listens_only(*self.listen, pids) else None

    def part_gang(self, ranks: tuple[int, ...]) -> GangRanks:
        """The gang of a part of this gang across nodes that runs ``ranks``: this one's address and port."""
        if self.gang is None or self.gang.master_port == 0:
            raise RuntimeError(f"{self.workload_id}: not a gang across nodes")
        return GangRanks(self.gang.world_size, tuple(ranks), self.gang.master_addr, self.gang.master_port)

    def progress(self, offset: int, wait_s: float) -> tuple[bytes, int | None, bool]:
        """(log bytes from ``offset``, exit code, ended) as soon as there is new output or the end, else after
        ``wait_s``. ``ended`` only once the guard wrote the code and the whole log has been handed out."""
        chunks, code, ended = self.progress_ranks({0: offset}, wait_s)
        return chunks[0], code, ended

    def progress_ranks(self, offsets: Mapping[int, int], wait_s: float) -> tuple[dict[int, bytes], int | None, bool]:
        """``progress`` for the logs of several ranks (0: the main log): the new bytes of each from its offset."""
        deadline_s = time.monotonic() + wait_s
        logs = {rank: rank_log_path(self.dir / guard.LOG_FILE, rank) for rank in offsets}
        exit_file = self.dir / guard.EXIT_FILE
        while True:
            ended = exit_file.exists()
            sizes = {rank: log.stat().st_size if log.exists() else 0 for rank, log in logs.items()}
            news = any(sizes[rank] > offset for rank, offset in offsets.items())
            if news or ended or time.monotonic() >= deadline_s:
                break
            time.sleep(0.05)
        chunks = {rank: _read_from(logs[rank], offset, sizes[rank]) for rank, offset in offsets.items()}
        done = ended and all(offset + len(chunks[rank]) >= sizes[rank] for rank, offset in offsets.items())
        return chunks, guard.read_code(exit_file) if done else None, done

    def stop(self, grace_s: float) -> None:
        self._tell(f"term {grace_s}")

    def kill(self) -> None:
        self._tell("kill")

    def guard_pid(self) -> int:
        """The guard's process id on its node (tests look for leftovers by it)."""
        return int((self.dir / guard.PID_FILE).read_text())

    def cleanup(self) -> None:
        """The end is recorded: remove the files and let the actor go."""
        shutil.rmtree(self.dir, ignore_errors=True)
        import ray  # only inside a running actor

        ray.actor.exit_actor()  # type: ignore[no-untyped-call]

    def _tell(self, line: str) -> None:
        with contextlib.suppress(BrokenPipeError):  # the guard has ended: nothing left to stop
            os.write(self._write_fd, f"{line}\n".encode())


def workload_pids(directory: Path) -> list[int]:
    """The workload's live processes on this node: the group its supervisor (the guard's child) leads."""
    try:
        guard_pid = int((directory / guard.PID_FILE).read_text())
    except (OSError, ValueError):
        return []
    stats = [stat for stat in map(read_proc_stat, all_pids()) if stat is not None and not is_gone(stat)]
    groups = {stat.pid for stat in stats if stat.ppid == guard_pid}
    return [stat.pid for stat in stats if stat.pgid in groups]


def _gang_from_master(part_of: PartOf) -> GangRanks:
    """The gang of a part, as its workload's actor tells it (once that one has chosen the port and started)."""
    import ray  # only inside a running actor

    master = ray.get_actor(part_of.master, namespace=part_of.namespace)
    gang: Any = ray.get(master.part_gang.remote(part_of.ranks), timeout=PORT_WAIT_S)
    if not isinstance(gang, GangRanks):
        raise RuntimeError(f"{part_of.master} told part {part_of.index} {gang!r}, not its ranks")
    return gang


def _read_from(log: Path, offset: int, size: int) -> bytes:
    """At most ``MAX_CHUNK_BYTES`` of ``log`` from ``offset`` (up to ``size``, what it held when looked at)."""
    if size <= offset:
        return b""
    with open(log, "rb") as handle:
        handle.seek(offset)
        return handle.read(min(size - offset, MAX_CHUNK_BYTES))


def _write_private(path: Path, text: str) -> None:
    with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as handle:
        handle.write(text)
