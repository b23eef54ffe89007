"""Launching for the scheduler loop: what a bound workload is started with (command, isolation environment, log
path), handed to a ``LaunchWorker`` (``server.launch_worker``) so that a slow ``Backend.launch`` never holds up a
step, and the handles that come back stored in one transaction per step (``collect``). ``SchedulerLoop`` owns one
``Launcher`` and submits launches only after their decisions are stored.

A bound workload goes through three states in its ``RunningEntry``: not launched (``launched`` False: decided,
stored, perhaps waiting for preempted victims to exit), launch submitted (``launched`` True, no ``handle`` yet:
queued or being started; ``withdraw`` can still take a queued one back), and started (``handle`` set).

What a failed step must not lose (issue 25): a launch that could not be handed to the worker stays not launched and
is handed over at the next step (``launch_ready``); an outcome taken from the worker is kept until it is stored (a
store error leaves it for the next ``collect``), and an entry learns its handle only once the handle is stored.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from pathlib import Path

from tessera.backends.base import Backend, GangPart, GangRanks, GpuShare, LaunchSpec
from tessera.gpu.gpus import GpuDevice
from tessera.gpu.isolation import isolation_env
from tessera.server.job_submit import array_env
from tessera.server.launch_worker import Launched, LaunchWorker, start_error
from tessera.server.loop_values import LoopConfig, RunningEntry, share_milli, started_text
from tessera.server.pool import Pool
from tessera.server.store.changes import HandleChange
from tessera.server.store.store import Event, Store

log = logging.getLogger(__name__)

# (entry, reason, now): a launch that failed; the loop ends the workload with that reason.
OnLaunchFailed = Callable[[RunningEntry, str, float], None]
SendStop = Callable[[str], None]  # (workload id): stop a workload whose stop is stored (the loop's, which retries)
PYTHON_UNBUFFERED = "PYTHONUNBUFFERED"
RESTARTS = "TESSERA_RESTARTS"  # launches of the workload before this one (a requeue, a resize, a service restart)


def gang_ranks(entry: RunningEntry, host_of: Callable[[int], str]) -> tuple[GangRanks | None, list[list[int]]]:
    """The ranks of a multi-worker workload (None for one worker) and its placements' indices grouped by host
    (``host_of`` a core node's index: a host with two GPU models is two core nodes), in the order the hosts first
    appear: the first host runs rank 0. Ranks are numbered host by host, so each host's ranks are consecutive."""
    by_host: dict[str, list[int]] = {}
    for index, placement in enumerate(entry.placements):
        by_host.setdefault(host_of(placement.node), []).append(index)
    groups = list(by_host.values()) or [[]]
    if entry.row.workers <= 1 and len(entry.placements) <= 1:
        return None, groups
    world = max(len(entry.placements), 1)
    return GangRanks(world, tuple(range(len(groups[0]) or 1))), groups


class Launcher:
    def __init__(
        self, store: Store, backend: Backend, pool: Pool, config: LoopConfig, failed: OnLaunchFailed, stop: SendStop
    ) -> None:
        self.store = store
        self.backend = backend
        self.pool = pool
        self.config = config
        self.failed = failed
        self.stop = stop
        self.worker = LaunchWorker(backend)
        self._logs_dir = config.run_dir / "logs"
        self._logs_made = False
        self._outcomes: list[Launched] = []  # taken from the worker, not stored yet (a failed step keeps them)

    def launch_ready(self, running: Mapping[int, RunningEntry], now: float) -> None:
        """Launch the bound workloads whose preempted victims have all exited (and those a failed step left)."""
        try:
            self.worker.revive()
        except Exception as exc:  # a host out of threads: they wait in the queue for the next step
            log.warning("the launch worker cannot be restarted; retried at the next step: %s", exc)
        ready: list[RunningEntry] = []
        for entry in list(running.values()):
            if not entry.launched and entry.stop_sent is None:
                # A victim waited for until it has exited: a preempted one leaves ``running``, a shrunk one's stop
                # is cleared when it is launched again on its remaining workers.
                entry.waits_for = {v for v in entry.waits_for if v in running and running[v].stop_sent is not None}
                if not entry.waits_for:
                    ready.append(entry)
        self.launch_all(ready, now)

    def launch_all(self, entries: list[RunningEntry], now: float) -> None:
        """Hand the launches of ``entries`` to the worker, in order; ``collect`` stores their handles once they are
        made. A workload whose launch cannot even be described (its log's directory cannot be made) fails. One that
        cannot be handed over (no thread to make it: a host out of threads) stays not launched, and so do those
        after it: the next ``launch_ready`` hands them over again, in the same order."""
        for entry in entries:
            try:
                spec = self.launch_spec(entry)
            except Exception as exc:  # not the host's lack of threads: it would fail the same way at every step
                log.warning("workload %s: its launch cannot be made: %s", entry.row.id, exc)
                self.failed(entry, start_error(exc), now)
                continue
            try:
                self.worker.submit(entry.row.id, spec)
            except RuntimeError as exc:  # no thread to make it; nothing was queued
                log.warning("workload %s and the launches after it are retried at the next step: %s", entry.row.id, exc)
                return
            entry.launched = True

    def withdraw(self, entry: RunningEntry) -> bool:
        """True when ``entry``'s process was never started and never will be: not launched yet, or its launch was
        still queued and is taken back. False once the launch has begun (its handle comes through ``collect``)."""
        if not entry.launched:
            return True
        if self.worker.withdraw(entry.row.id):
            entry.launched = False
            return True
        return False

    def collect(self, running: Mapping[int, RunningEntry], now: float) -> None:
        """The launches made since the last call (and those a failed step left): their handles stored in one
        transaction (a handle that a crash keeps from the store is found again by ``Backend.find`` in recovery),
        a failed one ended. A workload whose stop was decided while its launch was being made is stopped now that
        its process exists. An outcome leaves ``_outcomes`` only once it is stored."""
        self._outcomes.extend(self.worker.results())
        for failed in [o for o in self._outcomes if o.handle is None]:
            entry = running.get(failed.workload_id)
            if entry is not None:
                self.failed(entry, failed.error or "could not start", now)
            self._outcomes.remove(failed)
        if self._outcomes:
            self._store_handles([(o, running.get(o.workload_id)) for o in self._outcomes], now)

    def _store_handles(self, started: list[tuple[Launched, RunningEntry | None]], now: float) -> None:
        """Store the handles of the launches that started, then hand them to their entries; stop the workloads whose
        stop was decided while their launch was being made."""
        changes: list[HandleChange] = []
        events: list[Event] = []
        for launched, entry in started:
            assert launched.handle is not None
            if entry is not None:
                changes.append(HandleChange(entry.row.id, launched.handle))
                events.append(Event(entry.row.id, "started", started_text(launched.handle)))
        if changes:
            self.store.update_workloads(changes, events, now)
        self._outcomes = []  # stored: they are done
        for launched, entry in started:
            assert launched.handle is not None
            if entry is None:  # never happens: an entry leaves only after its end, which waits for its handle
                log.warning("launch of workload %s came back for no running workload", launched.workload_id)
                self.backend.stop(launched.handle.workload_id, 0.0)
                continue
            entry.handle = launched.handle
            if entry.stop_sent is not None:
                self.stop(launched.handle.workload_id)

    def settle(self, running: Mapping[int, RunningEntry], now: float) -> None:
        """Wait for the submitted launches at most ``config.launch_wait_s``, then ``collect``: a fast backend's
        handles are stored within the step that decided the launch, a slow one's at a later step."""
        if self.config.launch_wait_s > 0:
            self.worker.wait(self.config.launch_wait_s)
        self.collect(running, now)

    def shut_down(self, running: Mapping[int, RunningEntry], now: float, timeout_s: float) -> None:
        """The loop stops: queued launches are dropped (their decisions are stored, so a restarted server launches
        them), the one being made is waited for (at most ``timeout_s``) and its handle stored."""
        for workload_id in self.worker.withdraw_all():
            entry = running.get(workload_id)
            if entry is not None:
                entry.launched = False
        self.worker.wait(timeout_s)
        self.collect(running, now)

    def devices(self, entry: RunningEntry) -> tuple[GpuDevice, ...]:
        """The GPUs of the workload's placements, in order."""
        return tuple(self.pool.device(p.node, g) for p in entry.placements for g in p.gpu_indices)

    def launch_spec(self, entry: RunningEntry) -> LaunchSpec:
        row = entry.row
        gang, hosts = gang_ranks(entry, self._host)
        devices = self._devices_of(entry, hosts[0])  # of the host running rank 0 (all of them, with one worker)
        env = {PYTHON_UNBUFFERED: "1", **row.env, **array_env(row)}  # prints reach ``logs -f`` at once
        env[RESTARTS] = str(max(row.attempts - 1, 0))
        mps = self.config.mps and bool(devices)
        env.update(isolation_env(str(row.id), devices, share_milli(entry), row.gpu_mem_mib, mps=mps))
        if self.config.mps and devices and row.gpu_compute_pct:  # an explicit compute share (--gpu-compute)
            env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(row.gpu_compute_pct)
        if not self._logs_made:
            self.log_path(row.id).parent.mkdir(parents=True, exist_ok=True)
            self._logs_made = True
        shares = tuple(GpuShare(d.uuid, share_milli(entry)) for d in devices)
        node = devices[0].node if devices else self._node_of(entry)
        log_path = self.log_path(row.id)
        limits = self.config.limits
        ranks = len(gang.ranks) if gang is not None else 1
        return LaunchSpec(
            str(row.id),
            tuple(row.command),
            env,
            log_path,
            workdir=Path(row.cwd) if row.cwd else None,  # a missing one fails the launch, saying so
            tenant=row.tenant,
            node=node,
            gpus=shares,
            cpu_milli=row.cpu_milli * ranks,
            mem_max_mib=self._memory_mib(entry) * ranks,
            pids_max=limits.pids_max,
            log_max_bytes=limits.log_max_bytes,
            private_network=row.model_id is not None,  # a model replica: reachable only through its socket
            node_port=row.model_id is not None,  # ... or, where the backend picks ports on nodes (Ray), on one
            gang=gang,
            gang_parts=self._gang_parts(entry, hosts),
        )

    def _devices_of(self, entry: RunningEntry, indices: list[int]) -> tuple[GpuDevice, ...]:
        """The GPUs of the placements ``indices`` (all of them for a workload without placements), each once:
        workers sharing a GPU see it once."""
        chosen = [entry.placements[i] for i in indices] if indices else list(entry.placements)
        return tuple(dict.fromkeys(self.pool.device(p.node, g) for p in chosen for g in p.gpu_indices))

    def _gang_parts(self, entry: RunningEntry, hosts: list[list[int]]) -> tuple[GangPart, ...]:
        """The ranks on the hosts after the first (a gang across hosts), numbered after the first host's."""
        parts: list[GangPart] = []
        first = len(hosts[0])
        for indices in hosts[1:]:
            devices = self._devices_of(entry, indices)
            ranks = tuple(range(first, first + len(indices)))
            first += len(indices)
            shares = tuple(GpuShare(d.uuid, share_milli(entry)) for d in devices)
            memory = self._memory_mib(entry) * len(indices)
            node = self._host(entry.placements[indices[0]].node)
            parts.append(GangPart(node, ranks, shares, entry.row.cpu_milli * len(indices), memory))
        return tuple(parts)

    def _memory_mib(self, entry: RunningEntry) -> int:
        """One worker's memory limit: its request, else the server's default for the GPUs it asks for."""
        node = self.pool.nodes[entry.placements[0].node] if entry.placements else None
        node_mem_mib, node_gpus = (node.mem_mib, node.gpu_count) if node is not None else (0, 0)
        return self.config.limits.memory_mib(entry.row.mem_mib, entry.row.num_gpus, node_mem_mib, node_gpus)

    def _host(self, node: int) -> str:
        """The host of core node ``node`` (as its GPUs name it)."""
        devices = self.pool.devices[node]
        return devices[0].node if devices else self.pool.nodes[node].name

    def _node_of(self, entry: RunningEntry) -> str | None:
        """The host of a GPU-less workload's first placement (as its GPUs would name it), None when unplaced."""
        return self._host(entry.placements[0].node) if entry.placements else None

    def log_path(self, workload_id: int) -> Path:
        return self._logs_dir / f"{workload_id}.log"
