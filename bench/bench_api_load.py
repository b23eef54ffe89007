"""Submission load through the HTTP API of a real ``tessera up`` process: 10,000 submissions from a bounded local
client (a thread pool over one ``httpx.Client``), then a check that none was lost or duplicated, and the submit
latency percentiles and throughput.

The server runs as a subprocess on 127.0.0.1 (a free port, a temporary ``--data-dir`` with its SQLite store, a simulated
``1xA100-80GB`` pool, an admin token in ``TESSERA_ADMIN_TOKEN``), with its scheduler loop stepping all along. So that it
does not start 10,000 processes, a *blocker* workload first takes the whole GPU (``sleep``); every submission then asks
for a tenth of a GPU, which fits the pool but not now, and waits. At the end the server gets SIGTERM; the blocker, which
by design outlives the server (a restarted server would re-adopt it), is then stopped through its process group, and the
benchmark checks that no process of the run is left (no ``/proc`` command line names its data directory).

Usage: ``python bench/bench_api_load.py [--count 10000] [--concurrency 16]``. Linux only (``/proc``).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from tessera.client.http import wait_healthy

POOL = "1xA100-80GB"
READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0
PAGE = 10_000  # the API's largest page
BLOCKER = ["sleep", "3600"]  # the command of the workload that holds the GPU


@dataclass
class Server:
    process: subprocess.Popen[bytes]
    url: str
    token: str
    data_dir: Path
    log_path: Path

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@contextmanager
def tessera_up(data_dir: Path, gpus: str = POOL, run_as: str = "server") -> Iterator[Server]:
    """A ``tessera up`` subprocess, ready (``/healthz`` answers 200); stopped with SIGTERM afterwards (also used by
    ``control_plane_load.py``)."""
    port, token = free_port(), "bench-" + secrets.token_urlsafe(24)
    argv = [sys.executable, "-m", "tessera.cli", "up", "--host", "127.0.0.1", "--port", str(port)]
    argv += ["--gpus", gpus, "--data-dir", str(data_dir), "--run-as", run_as]
    env = {**os.environ, "TESSERA_ADMIN_TOKEN": token}  # never on the command line
    log_path = data_dir.parent / "server.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
    server = Server(process, f"http://127.0.0.1:{port}", token, data_dir, log_path)
    try:
        wait_ready(server)
        yield server
    finally:
        stop(server)


def wait_ready(server: Server) -> None:
    try:
        wait_healthy(server.url, READY_TIMEOUT_S, server.process.poll)
    except (RuntimeError, TimeoutError) as error:
        raise RuntimeError(f"tessera up: {error}:\n{server.log_tail()}") from None


def stop(server: Server) -> None:
    if server.process.poll() is None:
        server.process.send_signal(signal.SIGTERM)
        try:
            server.process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            server.process.kill()
            server.process.wait()
            raise RuntimeError(f"tessera up did not stop within {STOP_TIMEOUT_S:.0f} s of SIGTERM (killed)") from None


def submit_blocker(client: httpx.Client) -> int:
    """A workload holding the whole GPU until it is stopped; returns its id once it runs."""
    created = client.post("/v1/workloads", json={"command": BLOCKER, "gpus": 1, "name": "blocker"})
    created.raise_for_status()
    workload_id: int = created.json()["id"]
    deadline = time.monotonic() + 30.0
    while time.monotonic() < deadline:
        if client.get(f"/v1/workloads/{workload_id}").json()["state"] == "running":
            return workload_id
        time.sleep(0.1)
    raise RuntimeError("the blocker did not start within 30 s")


def blocker_pgid(data_dir: Path) -> int:
    """The blocker's process group: its supervisor leads it, and its command line names the data directory (its
    exit file) and ends with the blocker's command. Found in ``/proc``, not in an event's text (the API's
    "started" event no longer names a process: a handle is the backend's business)."""
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline:
        for pid, cmdline in processes_naming(data_dir):
            if cmdline.endswith(" -- " + " ".join(BLOCKER)):
                return os.getpgid(pid)
        time.sleep(0.1)
    raise RuntimeError("no supervisor of the blocker found in /proc")


def submit_all(client: httpx.Client, count: int, concurrency: int) -> tuple[list[float], float, list[str]]:
    """``count`` submissions from ``concurrency`` threads; per-request seconds, the wall time, and the errors."""

    def one(i: int) -> tuple[float, str | None]:
        body = {"command": ["true"], "gpus": 1, "gpu_fraction": 0.1, "name": f"load-{i}"}
        started = time.perf_counter()
        try:
            response = client.post("/v1/workloads", json=body)
        except httpx.HTTPError as exc:
            return time.perf_counter() - started, f"load-{i}: {exc!r}"
        elapsed = time.perf_counter() - started
        return elapsed, None if response.status_code == 201 else f"load-{i}: {response.status_code} {response.text}"

    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        results = list(pool.map(one, range(count)))
    wall_s = time.perf_counter() - started
    return [r[0] for r in results], wall_s, [r[1] for r in results if r[1] is not None]


def list_all(client: httpx.Client) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    after = 0
    while True:
        page = client.get("/v1/workloads", params={"limit": PAGE, "after": after}).json()
        rows.extend(page)
        if len(page) < PAGE:
            return rows
        after = page[-1]["id"]


def stop_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    os.killpg(pgid, signal.SIGKILL)


def processes_naming(data_dir: Path) -> list[tuple[int, str]]:
    """(pid, command line) of the processes whose command line names ``data_dir``, this one excepted."""
    found: list[tuple[int, str]] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        if str(data_dir) in cmdline:
            found.append((int(entry.name), cmdline))
    return found


def leftovers(data_dir: Path) -> list[str]:
    """Processes whose command line names ``data_dir`` (the server, workload supervisors), this one excepted."""
    return [f"{pid}: {cmdline}" for pid, cmdline in processes_naming(data_dir)]


def step_metrics(text: str) -> dict[str, float]:
    """The scheduler loop's steps while the load ran (``tessera_scheduling_step_seconds``): count and mean."""
    values = {}
    for line in text.splitlines():
        for suffix in ("sum", "count"):
            if line.startswith(f"tessera_scheduling_step_seconds_{suffix} "):
                values[suffix] = float(line.split()[1])
    count = values.get("count", 0.0)
    return {"count": count, "mean_s": round(values.get("sum", 0.0) / count, 4) if count else 0.0}


def percentile(sorted_values: list[float], pct: float) -> float:
    index = min(len(sorted_values) - 1, max(0, round(pct / 100 * len(sorted_values)) - 1))
    return sorted_values[index]


def run(count: int, concurrency: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="tessera-bench-load-") as tmp:
        data_dir = Path(tmp) / "data"
        pgid = None
        with tessera_up(data_dir) as server:
            headers = {"Authorization": f"Bearer {server.token}"}
            limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
            with httpx.Client(base_url=server.url, headers=headers, limits=limits, timeout=60.0) as client:
                blocker = submit_blocker(client)
                pgid = blocker_pgid(data_dir)
                latencies_s, wall_s, errors = submit_all(client, count, concurrency)
                listed_at = time.perf_counter()
                rows = [r for r in list_all(client) if r["id"] != blocker]
                list_s = time.perf_counter() - listed_at
                steps = step_metrics(client.get("/metrics").text)
        stop_group(pgid)
        left = leftovers(data_dir)
        exit_code = server.process.returncode
    names = {r["name"] for r in rows}
    ids = [r["id"] for r in rows]
    lat_ms = sorted(s * 1000 for s in latencies_s)
    return {
        "submitted": count,
        "concurrency": concurrency,
        "errors": len(errors),
        "first_errors": errors[:3],
        "listed": len(rows),
        "unique_ids": len(set(ids)),
        "all_names_present": names == {f"load-{i}" for i in range(count)},
        "states": sorted({r["state"] for r in rows}),
        "lost": count - len(names & {f"load-{i}" for i in range(count)}),
        "throughput_per_s": round(count / wall_s, 1),
        "wall_s": round(wall_s, 2),
        "latency_ms": {
            "p50": round(percentile(lat_ms, 50), 2),
            "p95": round(percentile(lat_ms, 95), 2),
            "p99": round(percentile(lat_ms, 99), 2),
            "max": round(lat_ms[-1], 2),
            "mean": round(statistics.fmean(lat_ms), 2),
        },
        "list_all_s": round(list_s, 2),
        "loop_steps_during_run": steps,
        "server_exit_code": exit_code,
        "processes_left": left,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=10_000, help="submissions")
    parser.add_argument("--concurrency", type=int, default=16, help="client threads (and connections)")
    args = parser.parse_args()
    result = run(args.count, args.concurrency)
    lat = result["latency_ms"]
    header = ("submissions", "throughput/s", "p50 ms", "p95 ms", "p99 ms", "max ms", "lost")
    print(f"{header[0]:>12} {header[1]:>13} " + " ".join(f"{h:>8}" for h in header[2:6]) + f" {header[6]:>5}")
    print(
        f"{result['submitted']:>12,} {result['throughput_per_s']:>13,.1f} {lat['p50']:>8.2f} {lat['p95']:>8.2f} "
        f"{lat['p99']:>8.2f} {lat['max']:>8.2f} {result['lost']:>5}"
    )
    print(json.dumps(result))
    ok = (
        result["errors"] == 0
        and result["listed"] == result["unique_ids"] == args.count
        and result["all_names_present"]
        and not result["processes_left"]
        and result["server_exit_code"] == 0
    )
    if not ok:
        print("FAILED: lost or duplicated submissions, errors, or processes left (see the JSON above)", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
