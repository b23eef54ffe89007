"""Launching for the scheduler loop: what a bound workload is started with (command, isolation environment, log
path) and the batched launch-and-record (``launch_all``: every launch of a step, then their handles in one
transaction). ``SchedulerLoop`` owns one ``Launcher`` and calls it after its decisions are stored.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

from tessera.backends.base import Backend, Handle, LaunchSpec
from tessera.errors import TesseraError
from tessera.gpu.gpus import GpuDevice
from tessera.gpu.isolation import isolation_env
from tessera.server.loop_values import LoopConfig, RunningEntry, share_milli, started_text
from tessera.server.pool import Pool
from tessera.server.store.changes import HandleChange
from tessera.server.store.store import Event, Store

# (entry, reason, now): a launch that failed; the loop ends the workload as failed with that reason.
OnLaunchFailed = Callable[[RunningEntry, str, float], None]


class Launcher:
    def __init__(self, store: Store, backend: Backend, pool: Pool, config: LoopConfig, failed: OnLaunchFailed) -> None:
        self.store = store
        self.backend = backend
        self.pool = pool
        self.config = config
        self.failed = failed
        self._logs_dir = config.run_dir / "logs"
        self._logs_made = False

    def launch_ready(self, running: Mapping[int, RunningEntry], now: float) -> None:
        """Launch the bound workloads whose preempted victims have all exited."""
        ready: list[RunningEntry] = []
        for entry in list(running.values()):
            if not entry.launched and entry.stop_sent is None:
                entry.waits_for &= set(running)
                if not entry.waits_for:
                    ready.append(entry)
        self.launch_all(ready, now)

    def launch_all(self, entries: list[RunningEntry], now: float) -> None:
        """Launch ``entries`` and store their handles in one transaction (one per launch made a step over
        thousands of binds take seconds). A handle that a crash keeps from the store is found again by
        ``Backend.find`` in recovery, as before."""
        changes: list[HandleChange] = []
        events: list[Event] = []
        for entry in entries:
            handle = self._launch(entry, now)
            if handle is not None:
                entry.handle = handle
                changes.append(HandleChange(entry.row.id, handle))
                events.append(Event(entry.row.id, "started", started_text(handle)))
        if changes:
            self.store.update_workloads(changes, events, now)

    def _launch(self, entry: RunningEntry, now: float) -> Handle | None:
        """Start the workload of ``entry``; None when it could not start (the workload has then failed)."""
        spec = self.launch_spec(entry)
        entry.launched = True
        try:
            return self.backend.launch(spec)
        except (OSError, TesseraError) as exc:
            self.failed(entry, f"could not start: {exc}", now)
            return None

    def devices(self, entry: RunningEntry) -> tuple[GpuDevice, ...]:
        """The GPUs of the workload's placements, in order."""
        return tuple(self.pool.device(p.node, g) for p in entry.placements for g in p.gpu_indices)

    def launch_spec(self, entry: RunningEntry) -> LaunchSpec:
        row = entry.row
        devices = self.devices(entry)
        env = dict(row.env)
        mps = self.config.mps and bool(devices)
        env.update(isolation_env(str(row.id), devices, share_milli(entry), row.gpu_mem_mib, mps=mps))
        if self.config.mps and devices and row.gpu_compute_pct:  # an explicit compute share (--gpu-compute)
            env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(row.gpu_compute_pct)
        if not self._logs_made:
            self.log_path(row.id).parent.mkdir(parents=True, exist_ok=True)
            self._logs_made = True
        return LaunchSpec(str(row.id), tuple(row.command), env, self.log_path(row.id), tenant=row.tenant)

    def log_path(self, workload_id: int) -> Path:
        return self._logs_dir / f"{workload_id}.log"
