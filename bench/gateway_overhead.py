"""The serving gateway's added latency: open-loop Poisson arrivals of streaming chat requests against sim engines on
127.0.0.1, each request sent either through the gateway or straight to an engine (chosen at random, so both arms
see the same engines under the same load in the same run), and the difference of their latency percentiles.

What runs: ``--engines`` sim engine processes (``tessera.serving.engines.sim_server``, model ``bench``, paced by the
part-1 engine model at ``--speedup``), one gateway process (``python -m tessera.serving.gateway.serve``, least-load
router over all engines, one API key) and this load generator (asyncio, a minimal HTTP/1.1 client over keep-alive
connections: it reads raw bytes and stamps the first SSE event and the end of the chunked body, to spend as little
of the two cores as it can). Arrivals are Poisson at ``--rate`` requests/s in all, a ``--direct-fraction`` of them
straight to an engine (round robin), for ``--duration-s`` per run after a ``--warmup-s`` warm-up that is not counted
(it fills both sides' connection pools). A request's clock starts when its bytes are written on a pooled
connection, so the client's own scheduling lag counts in neither arm.

Reported per run: requests and errors per arm, TTFT and end-to-end p50/p99 per arm, the added latency
(gateway minus direct, of each percentile), and the gateway's resident memory (VmRSS, peak VmHWM).

Usage: ``PYTHONPATH=src python bench/gateway_overhead.py [--rate 1000] [--duration-s 10] [--runs 3] [--json OUT]``.
Linux only (``/proc``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

READY_TIMEOUT_S = 60.0
KEY = "bench-key"
MODEL = "bench"


@dataclass
class Sample:
    via_gateway: bool
    ok: bool
    ttft_s: float = 0.0
    e2e_s: float = 0.0


@dataclass
class Pool:
    """Idle keep-alive connections to one host:port."""

    host: str
    port: int
    idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = field(default_factory=list)

    async def get(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self.idle:
            return self.idle.pop()
        return await asyncio.open_connection(self.host, self.port)

    def put(self, conn: tuple[asyncio.StreamReader, asyncio.StreamWriter]) -> None:
        self.idle.append(conn)


def request_bytes(port: int, max_tokens: int, key: str | None) -> bytes:
    body = json.dumps(
        {"model": MODEL, "messages": [{"role": "user", "content": "Tell me a story."}], "max_tokens": max_tokens,
         "stream": True}
    ).encode()  # fmt: skip
    auth = f"authorization: Bearer {key}\r\n" if key else ""
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\ncontent-type: application/json\r\n"
        f"{auth}content-length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


async def one(pool: Pool, payload: bytes, via_gateway: bool, timeout_s: float) -> Sample:
    try:
        reader, writer = await pool.get()
    except OSError:
        return Sample(via_gateway, False)
    start = time.perf_counter()
    first = 0.0
    buffer = b""
    try:
        writer.write(payload)
        async with asyncio.timeout(timeout_s):
            while True:
                data = await reader.read(65536)
                if not data:
                    raise ConnectionError("closed")
                buffer = buffer[-16:] + data if first else buffer + data
                if not first and b"data: " in data:
                    first = time.perf_counter()
                    if not buffer.startswith(b"HTTP/1.1 200"):
                        raise ConnectionError(buffer[:100].decode("latin-1"))
                if buffer.endswith(b"0\r\n\r\n") and first:
                    break
                if not first and buffer.startswith(b"HTTP/1.1 ") and not buffer.startswith(b"HTTP/1.1 200"):
                    raise ConnectionError(buffer[:100].decode("latin-1"))
    except (OSError, TimeoutError, ConnectionError):
        writer.close()
        return Sample(via_gateway, False)
    end = time.perf_counter()
    pool.put((reader, writer))
    return Sample(via_gateway, True, first - start, end - start)


async def load(gateway: Pool, engines: list[Pool], args: argparse.Namespace, seconds: float, seed: int) -> list[Sample]:
    rng = random.Random(seed)
    gateway_payload = request_bytes(gateway.port, args.max_tokens, KEY)
    direct_payloads = [request_bytes(p.port, args.max_tokens, None) for p in engines]
    tasks: list[asyncio.Task[Sample]] = []
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    at = 0.0
    turn = 0
    while at < seconds:
        at += rng.expovariate(args.rate)
        delay = t0 + at - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        if rng.random() < args.direct_fraction:
            turn = (turn + 1) % len(engines)
            tasks.append(asyncio.ensure_future(one(engines[turn], direct_payloads[turn], False, args.timeout_s)))
        else:
            tasks.append(asyncio.ensure_future(one(gateway, gateway_payload, True, args.timeout_s)))
    return list(await asyncio.gather(*tasks))


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def summarize(samples: list[Sample]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for arm, via in (("gateway", True), ("direct", False)):
        mine = [s for s in samples if s.via_gateway == via]
        good = [s for s in mine if s.ok]
        out[arm] = {
            "requests": len(mine),
            "errors": len(mine) - len(good),
            "ttft_p50_ms": 1000 * percentile([s.ttft_s for s in good], 0.50),
            "ttft_p99_ms": 1000 * percentile([s.ttft_s for s in good], 0.99),
            "e2e_p50_ms": 1000 * percentile([s.e2e_s for s in good], 0.50),
            "e2e_p99_ms": 1000 * percentile([s.e2e_s for s in good], 0.99),
        }
    g, d = out["gateway"], out["direct"]
    out["added_ms"] = {name: g[name] - d[name] for name in ("ttft_p50_ms", "ttft_p99_ms", "e2e_p50_ms", "e2e_p99_ms")}
    return out


def proc_memory_mib(pid: int) -> dict[str, float]:
    fields: dict[str, float] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            fields[name] = int(value.split()[0]) / 1024
    return fields


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_port(port: int, process: subprocess.Popen[bytes]) -> None:
    import socket

    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"process {process.args!r} exited with {process.returncode}")
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise SystemExit(f"nothing listens on port {port} after {READY_TIMEOUT_S} s")


@contextmanager
def processes(args: argparse.Namespace) -> Iterator[tuple[int, list[int], int]]:
    """Start the engines and the gateway; yield (gateway port, engine ports, gateway pid); stop them all."""
    started: list[subprocess.Popen[bytes]] = []
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, ["src", os.environ.get("PYTHONPATH", "")]))}
    try:
        ports = [free_port() for _ in range(args.engines)]
        for port in ports:
            argv = [sys.executable, "-m", "tessera.serving.engines.sim_server", "--model", MODEL, "--port", str(port),
                    "--speedup", str(args.speedup)]  # fmt: skip
            started.append(subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, start_new_session=True))
        gateway_port = free_port()
        urls = ",".join(f"http://127.0.0.1:{p}" for p in ports)
        argv = [sys.executable, "-m", "tessera.serving.gateway.serve", "--port", str(gateway_port), "--model",
                f"{MODEL}={urls}", "--key", f"{KEY}=bench", "--router", args.router]  # fmt: skip
        gateway = subprocess.Popen(argv, env=env, start_new_session=True)
        started.append(gateway)
        for port, process in zip([*ports, gateway_port], started, strict=True):
            wait_port(port, process)
        yield gateway_port, ports, gateway.pid
    finally:
        for process in started:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for process in started:
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    runs: list[dict[str, Any]] = []
    with processes(args) as (gateway_port, engine_ports, gateway_pid):
        gateway = Pool("127.0.0.1", gateway_port)
        engines = [Pool("127.0.0.1", p) for p in engine_ports]
        for run in range(args.runs):
            await load(gateway, engines, args, args.warmup_s, seed=1000 + run)
            samples = await load(gateway, engines, args, args.duration_s, seed=run)
            result = summarize(samples)
            result["gateway_memory_mib"] = proc_memory_mib(gateway_pid)
            runs.append(result)
            print(f"run {run}: {json.dumps(result)}", flush=True)
    return {"args": vars(args), "runs": runs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=float, default=1000.0, help="arrivals per second, both arms together")
    parser.add_argument("--direct-fraction", type=float, default=0.5, help="share of arrivals sent straight to engines")
    parser.add_argument("--duration-s", type=float, default=10.0)
    parser.add_argument("--warmup-s", type=float, default=2.0)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--engines", type=int, default=2)
    parser.add_argument("--speedup", type=float, default=1.0, help="the sim engines' pace (1: the modelled GPU's)")
    parser.add_argument("--max-tokens", type=int, default=16, help="output tokens per request")
    parser.add_argument("--router", default="least-load")
    parser.add_argument("--timeout-s", type=float, default=30.0)
    parser.add_argument("--json", type=Path, help="write the results there too")
    args = parser.parse_args()
    result = asyncio.run(bench(args))
    added = [r["added_ms"] for r in result["runs"]]
    for name in ("ttft_p50_ms", "ttft_p99_ms", "e2e_p50_ms", "e2e_p99_ms"):
        print(
            f"added {name}: "
            + ", ".join(f"{a[name]:.2f}" for a in added)
            + f" (median {statistics.median(a[name] for a in added):.2f})"
        )
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
