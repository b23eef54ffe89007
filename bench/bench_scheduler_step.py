"""One scheduling step of the control plane (``SchedulerLoop.step``) over 10,000 pending workloads on a simulated
1,000-GPU pool (125 nodes x 8 A100-80GB), with the store on SQLite and the fake backend (no process is started).

Prints one JSON object per measured step: the whole step and its parts (reading the pending workloads from the
store, planning with the core scheduler, writing the decisions, launching). The first step places as much of the
10,000 as fits; then ``--finish`` running workloads end and a second step refills the room they left; a third step
has nothing new to do; for a fourth, new submissions bring the pending workloads back to 10,000 on the busy pool.
The target of issue 4 is a step of at most 1 s; the core's planning is measured as it is in this checkout. A step
tries at most ``LoopConfig.max_tries_per_step`` workloads (1,000 by default); the rest wait for the next step.
Usage: ``python bench/bench_scheduler_step.py [--pending N] [--nodes N]``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from tessera.api import WorkloadSpec
from tessera.backends.fake import FakeBackend
from tessera.errors import TesseraError
from tessera.gpu.gpus import SimulatedProbe, parse_gpu_spec
from tessera.server.loop import SchedulerLoop
from tessera.server.loop_values import LoopConfig
from tessera.server.pool import HostResources
from tessera.server.store.models import WorkloadRow
from tessera.server.submit import Principal, workload_row
from tessera.server.up import Server, UpConfig, build_server

NODE_HOST = HostResources(cpu_milli=128_000, mem_mib=1024 * 1024)  # per node: 128 cores, 1 TiB
START_S = 1_700_000_000.0
# (weight, body): fractional shares, whole GPUs, multi-GPU and CPU-only, as a team's queue might hold them.
MIX: tuple[tuple[float, dict[str, Any]], ...] = (
    (0.15, {"gpus": 1, "gpu_fraction": 0.25, "cpu": 2, "mem": "8GiB"}),
    (0.15, {"gpus": 1, "gpu_fraction": 0.5, "cpu": 4, "mem": "16GiB"}),
    (0.10, {"gpus": 1, "gpu_milli": 300, "gpu_mem": "20GiB", "cpu": 2, "mem": "8GiB"}),
    (0.20, {"gpus": 1, "cpu": 8, "mem": "32GiB"}),
    (0.12, {"gpus": 2, "cpu": 16, "mem": "64GiB"}),
    (0.08, {"gpus": 4, "cpu": 32, "mem": "128GiB"}),
    (0.05, {"gpus": 8, "cpu": 64, "mem": "256GiB"}),
    (0.15, {"cpu": 1, "mem": "2GiB"}),
)


class Clock:
    def __init__(self) -> None:
        self.now_s = START_S

    def __call__(self) -> float:
        return self.now_s


class Timers:
    """Seconds and calls per part, from wrappers put around a loop's methods (instance attributes only)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)

    def wrap(self, owner: object, method: str, part: str) -> None:
        inner: Callable[..., Any] = getattr(owner, method)

        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                self.seconds[part] += time.perf_counter() - started
                self.calls[part] += 1

        setattr(owner, method, timed)

    @contextmanager
    def measure(self) -> Iterator[None]:
        self.seconds.clear()
        self.calls.clear()
        yield


def build(data_dir: Path, nodes: int) -> tuple[Server, FakeBackend, Clock]:
    devices = [d for n in range(nodes) for d in parse_gpu_spec("8xA100-80GB", node=f"node-{n:03d}")]
    backend, clock = FakeBackend(), Clock()
    config = UpConfig(data_dir=data_dir, gpus="simulated", loop=LoopConfig(run_dir=data_dir))
    server = build_server(config, probe=SimulatedProbe(devices), backend=backend, host=NODE_HOST, clock=clock)
    return server, backend, clock


def submit_pending(server: Server, count: int, seed: int, first_s: float) -> float:
    """``count`` validated submissions (as the API builds them) one second apart from ``first_s``, stored in one
    transaction; returns the seconds it took."""
    started = time.perf_counter()
    rng = np.random.default_rng(seed)
    weights = np.array([w for w, _ in MIX])
    choices = rng.choice(len(MIX), size=count, p=weights / weights.sum())
    store, pool = server.ctx.store, server.ctx.pool
    queues, admin = store.queues(), Principal(None, True)
    rows: list[WorkloadRow] = []
    for i, choice in enumerate(choices):
        spec = WorkloadSpec(command=["true"], name=f"bench-{seed}-{i}", **MIX[int(choice)][1])
        rows.append(workload_row(spec, admin, queues, pool, first_s + i))
    with store.session() as session, session.begin():
        session.add_all(rows)
    return time.perf_counter() - started


def instrument(loop: SchedulerLoop) -> Timers:
    timers = Timers()
    loop._refresh_queues()  # builds the scheduler once; later steps keep it (the queues do not change)
    # Reading the new pending workloads: the loop's intake (before it was split out, ``_pending_workloads``).
    if hasattr(loop, "intake"):
        timers.wrap(loop.intake, "sync", "read_pending_s")
    else:
        timers.wrap(loop, "_pending_workloads", "read_pending_s")
    timers.wrap(loop.scheduler, "plan", "plan_s")
    # Applying: each plan committed to the books (``_apply``), then the tick stored and acted on (``_flush``; before
    # ticks were batched, all of it in ``_apply``).
    timers.wrap(loop, "_apply", "apply_s")
    if hasattr(loop, "_flush"):
        timers.wrap(loop, "_flush", "flush_s")
    # Launching, with the store writes of the handles: ``Launcher.launch_all`` (before the loop was split, its own
    # ``_launch_all``; before launches were batched, ``_launch`` per workload).
    if hasattr(loop, "launcher"):
        timers.wrap(loop.launcher, "launch_all", "launch_s")
    else:
        timers.wrap(loop, "_launch_all" if hasattr(loop, "_launch_all") else "_launch", "launch_s")
    timers.wrap(loop.backend, "launch", "backend_launch_s")
    timers.wrap(loop.store, "update_workloads", "store_writes_s")
    return timers


def measured_step(name: str, loop: SchedulerLoop, timers: Timers) -> dict[str, Any]:
    with timers.measure():
        report = loop.step()
    parts = {k: round(v, 4) for k, v in sorted(timers.seconds.items())}
    return {
        "step": name,
        "step_s": round(report.duration_s, 4),
        **parts,
        "write_decisions_s": round(timers.seconds["apply_s"] - timers.seconds["launch_s"], 4),
        "store_write_transactions": timers.calls["store_writes_s"],
        "pending_before": report.pending,
        "binds": report.binds,
        "ended": report.ended,
        "launched": timers.calls["backend_launch_s"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pending", type=int, default=10_000, help="pending workloads before the first step")
    parser.add_argument("--nodes", type=int, default=125, help="nodes of 8 A100-80GB each")
    parser.add_argument("--finish", type=int, default=50, help="running workloads that end before the second step")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    try:
        with tempfile.TemporaryDirectory(prefix="tessera-bench-step-") as tmp:
            server, backend, clock = build(Path(tmp), args.nodes)
            loop = server.ctx.loop
            submit_s = submit_pending(server, args.pending, args.seed, START_S - args.pending)
            gpus = sum(len(d) for d in server.ctx.pool.devices)
            setup = {"pending": args.pending, "nodes": args.nodes, "gpus": gpus, "store": "sqlite", "setup_s": submit_s}
            print(json.dumps({"setup": setup}))
            timers = instrument(loop)
            clock.now_s += 1.0
            print(json.dumps(measured_step("first", loop, timers)))
            for workload_id in sorted(backend.tracked(), key=int)[: args.finish]:
                backend.finish(workload_id, 0)
            clock.now_s += 60.0
            print(json.dumps(measured_step(f"after {args.finish} finished", loop, timers)))
            clock.now_s += 1.0
            print(json.dumps(measured_step("nothing changed", loop, timers)))
            top_up = args.pending - len(server.ctx.store.ids_in("pending"))
            submit_pending(server, top_up, args.seed + 1, clock.now_s)
            clock.now_s += top_up + 1.0
            print(json.dumps(measured_step(f"{top_up} more submitted: {args.pending} pending again", loop, timers)))
            server.backend.close()
            server.ctx.store.engine.dispose()
    except TesseraError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
