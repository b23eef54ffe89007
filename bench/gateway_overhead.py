"""The serving gateway's added latency: open-loop Poisson arrivals of streaming chat requests at ``--rate`` against sim
engines on 127.0.0.1, through the gateway and straight to the engines, in the same run, and the difference of their
latency percentiles.

What runs: ``--engines`` sim engine processes (``tessera.serving.engines.sim_server``, model ``bench``, paced by the
part-1 engine model at ``--speedup``), one gateway process (``python -m tessera.serving.gateway.serve``, one API
key, the ``--router`` (prefix-affinity by default, its prefix index capped at ``--max-prefix-entries``)) and this
load generator (asyncio, a minimal HTTP/1.1 client over keep-alive connections: it reads raw bytes and stamps the
first SSE event and the end of the chunked body, to spend as little of the cores as it can).

How the arms share a run: one Poisson arrival process at ``--rate`` runs, cut into windows of ``--window-s`` that
the arms take in turn: the gateway, straight to an engine (round robin) and, with ``--baseline-src`` (another
source tree, e.g. main's), a second gateway run from that tree. Each arm thus sees ``--rate`` requests/s for
``--duration-s`` in all, on the same engines under the same machine load, interleaved every half second (the
first window's arm rotates between runs). A ``--warmup-s`` warm-up of the same shape comes first and is not
counted (it fills the connection pools). A request's clock starts when its bytes are written on a pooled
connection; how late that was against its scheduled arrival is reported too (``send_lag``: the load generator's
own lag; the direct arm's latency is the floor the generator and the engines set).

Prompts exercise the prefix index: a system prompt drawn from 32 (four 64-character blocks each) and a user message
unique to the request (four more blocks), so each request brings about four new prefix entries and shares four.

Reported per run (one JSON line): requests and errors per arm, TTFT and end-to-end p50/p99 per arm, the added
latency (gateway minus direct, of each percentile; the baseline's too), the send lag, CPU shares and CPU per
request, the gateway's resident memory at the run's start and end (VmRSS, peak VmHWM) and its prefix index size
(from its ``/health``), the load average; then a summary over the runs (medians, worst, whether p50 <= 1 ms and
p99 <= 5 ms added TTFT held in every run).

uvloop and httptools (uvicorn's fast parser) are used by every process when importable. The load generator runs
each timed run with its garbage collector off (``load_without_gc_pauses``), so that its own pauses do not land on
one arm's window.

Usage: ``PYTHONPATH=src python bench/gateway_overhead.py [--rate 1000] [--duration-s 10] [--runs 3] [--json OUT]``.
Linux only (``/proc``).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import importlib
import importlib.util
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from collections import Counter
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
    arm: str  # "gateway", "direct" or "baseline"
    ok: bool
    ttft_s: float = 0.0
    e2e_s: float = 0.0
    lag_s: float = 0.0  # from the scheduled arrival to the request's bytes being written
    error: str = ""


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

    async def fresh(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.open_connection(self.host, self.port)

    def put(self, conn: tuple[asyncio.StreamReader, asyncio.StreamWriter]) -> None:
        self.idle.append(conn)


SYSTEM_PROMPTS = [(f"You are assistant {n:02d}. " * 12)[:256] for n in range(32)]
FILLER = ("Please summarise the following notes carefully. " * 6)[:240]


def request_bytes(port: int, max_tokens: int, key: str | None, tag: str, system: str) -> bytes:
    user = f"[{tag:>14}]" + FILLER  # unique from its first block on: four new prefix blocks per request
    body = json.dumps(
        {"model": MODEL, "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
         "max_tokens": max_tokens, "stream": True}
    ).encode()  # fmt: skip
    auth = f"authorization: Bearer {key}\r\n" if key else ""
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\ncontent-type: application/json\r\n"
        f"{auth}content-length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


async def one(pool: Pool, payload: bytes, arm: str, timeout_s: float, due: float) -> Sample:
    """One request; a kept-alive connection the server closed meanwhile (its idle timeout) before answering
    anything is replaced by a fresh one once, as any HTTP client does."""
    for attempt in (0, 1):
        try:
            reader, writer = await (pool.get() if attempt == 0 else pool.fresh())
        except OSError as exc:
            return Sample(arm, False, error=type(exc).__name__)
        sample = await exchange(reader, writer, payload, arm, timeout_s, due)
        if sample.ok:
            pool.put((reader, writer))
            return sample
        writer.close()
        if sample.error != "closed before answering":
            return sample
    return sample


async def exchange(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, payload: bytes, arm: str, timeout_s: float,
    due: float,
) -> Sample:  # fmt: skip
    start = time.perf_counter()
    lag = max(0.0, start - due)
    first = 0.0
    buffer = b""
    try:
        writer.write(payload)
        async with asyncio.timeout(timeout_s):
            while True:
                data = await reader.read(65536)
                if not data:
                    raise ConnectionError("closed" if buffer else "closed before answering")
                buffer = buffer[-16:] + data if first else buffer + data
                if not first and b"data: " in data:
                    first = time.perf_counter()
                    if not buffer.startswith(b"HTTP/1.1 200"):
                        raise ConnectionError(buffer[:12].decode("latin-1"))
                if buffer.endswith(b"0\r\n\r\n") and first:
                    break
                if not first and buffer.startswith(b"HTTP/1.1 ") and not buffer.startswith(b"HTTP/1.1 200"):
                    raise ConnectionError(buffer[:12].decode("latin-1"))
    except (OSError, TimeoutError, ConnectionError) as exc:
        return Sample(arm, False, error=str(exc) or type(exc).__name__)
    end = time.perf_counter()
    return Sample(arm, True, first - start, end - start, lag)


async def load(gateways: dict[str, Pool], engines: list[Pool], args: argparse.Namespace, seconds: float, seed: int
               ) -> list[Sample]:  # fmt: skip
    """``seconds`` of each arm: Poisson arrivals at ``args.rate`` for (arms x ``seconds``), the arms taking turns
    window by window (the first window's arm rotates with ``seed``)."""
    arms = [*gateways, "direct"]
    rng = random.Random(seed)
    tasks: list[asyncio.Task[Sample]] = []
    loop = asyncio.get_running_loop()
    offset = time.perf_counter() - loop.time()  # loop clock -> perf_counter
    t0 = loop.time()
    at = 0.0
    turn = 0
    count = 0
    while at < len(arms) * seconds:
        at += rng.expovariate(args.rate)
        delay = t0 + at - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        count += 1
        tag, system = f"{seed}-{count}", SYSTEM_PROMPTS[rng.randrange(len(SYSTEM_PROMPTS))]
        due = t0 + at + offset
        arm = arms[(int(at / args.window_s) + seed) % len(arms)]
        if arm == "direct":
            turn = (turn + 1) % len(engines)
            pool, key = engines[turn], None
        else:
            pool, key = gateways[arm], KEY
        payload = request_bytes(pool.port, args.max_tokens, key, tag, system)
        tasks.append(asyncio.ensure_future(one(pool, payload, arm, args.timeout_s, due)))
    return list(await asyncio.gather(*tasks))


async def load_without_gc_pauses(gateways: dict[str, Pool], engines: list[Pool], args: argparse.Namespace, run: int
                                 ) -> list[Sample]:  # fmt: skip
    """A run's ``load`` with this process's cyclic garbage collector off: it keeps every request's task and sample
    until the run ends, so its full collections grew to 30-100 ms over a run, and each one stalled the clock of
    every request in flight (of whichever arm's window it fell in). Collected between runs instead."""
    gc.collect()
    gc.disable()
    try:
        return await load(gateways, engines, args, args.duration_s, seed=run)
    finally:
        gc.enable()


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def summarize(samples: list[Sample], arms: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for arm in arms:
        mine = [s for s in samples if s.arm == arm]
        good = [s for s in mine if s.ok]
        out[arm] = {
            "requests": len(mine),
            "errors": len(mine) - len(good),
            "error_kinds": dict(Counter(s.error for s in mine if not s.ok)),
            "ttft_p50_ms": 1000 * percentile([s.ttft_s for s in good], 0.50),
            "ttft_p99_ms": 1000 * percentile([s.ttft_s for s in good], 0.99),
            "e2e_p50_ms": 1000 * percentile([s.e2e_s for s in good], 0.50),
            "e2e_p99_ms": 1000 * percentile([s.e2e_s for s in good], 0.99),
            "send_lag_p99_ms": 1000 * percentile([s.lag_s for s in good], 0.99),
        }
    d = out["direct"]
    for arm in arms[:-1]:  # "added_ms" for the gateway, "baseline_added_ms" for the baseline gateway
        g = out[arm]
        out["added_ms" if arm == "gateway" else f"{arm}_added_ms"] = {
            name: g[name] - d[name] for name in ("ttft_p50_ms", "ttft_p99_ms", "e2e_p50_ms", "e2e_p99_ms")
        }
    return out


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


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
def processes(args: argparse.Namespace) -> Iterator[tuple[dict[str, int], list[int], dict[str, int]]]:
    """Start the engines and the gateway (and the baseline gateway from ``--baseline-src``); yield (gateway ports
    by arm, engine ports, pids by name: each gateway arm's and "engines" for the first engine); stop them all."""
    started: list[subprocess.Popen[bytes]] = []

    def env(src: str) -> dict[str, str]:
        return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [src, os.environ.get("PYTHONPATH", "")]))}

    try:
        ports = [free_port() for _ in range(args.engines)]
        for port in ports:
            argv = [sys.executable, "-m", "tessera.serving.engines.sim_server", "--model", MODEL, "--port", str(port),
                    "--speedup", str(args.speedup)]  # fmt: skip
            started.append(subprocess.Popen(argv, env=env("src"), stdout=subprocess.DEVNULL, start_new_session=True))
        urls = ",".join(f"http://127.0.0.1:{p}" for p in ports)
        gateways = {"gateway": "src"} | ({"baseline": str(args.baseline_src)} if args.baseline_src else {})
        gateway_ports = {arm: free_port() for arm in gateways}
        for arm, src in gateways.items():
            argv = [sys.executable, "-m", "tessera.serving.gateway.serve", "--port", str(gateway_ports[arm]),
                    "--model", f"{MODEL}={urls}", "--key", f"{KEY}=bench", "--router", args.router,
                    "--max-prefix-entries", str(args.max_prefix_entries)]  # fmt: skip
            started.append(subprocess.Popen(argv, env=env(src), start_new_session=True))
        for port, process in zip([*ports, *gateway_ports.values()], started, strict=True):
            wait_port(port, process)
        pids = {arm: process.pid for arm, process in zip(gateways, started[len(ports) :], strict=True)}
        yield gateway_ports, ports, pids | {f"engine{i}": p.pid for i, p in enumerate(started[: len(ports)])}
    finally:
        for process in started:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for process in started:
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)


async def gateway_health(port: int) -> dict[str, Any]:
    """The gateway's ``/health`` (its prefix index size)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(f"GET /health HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\nconnection: close\r\n\r\n".encode())
        data = await reader.read()
    finally:
        writer.close()
    try:
        health: dict[str, Any] = json.loads(data.partition(b"\r\n\r\n")[2])
    except ValueError:
        return {}
    return health


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    runs: list[dict[str, Any]] = []
    with processes(args) as (gateway_ports, engine_ports, pids):
        gateways = {arm: Pool("127.0.0.1", port) for arm, port in gateway_ports.items()}
        engines = [Pool("127.0.0.1", p) for p in engine_ports]
        arms = [*gateways, "direct"]
        for run in range(args.runs):
            await load(gateways, engines, args, args.warmup_s, seed=1000 + run)
            memory_start = {arm: proc_memory_mib(pids[arm]) for arm in gateways}
            load_start = Path("/proc/loadavg").read_text().split()[:3]
            before = {name: cpu_s(pid) for name, pid in pids.items()} | {"load_generator": time.process_time()}
            wall = time.perf_counter()
            samples = await load_without_gc_pauses(gateways, engines, args, run)
            wall = time.perf_counter() - wall
            after = {name: cpu_s(pid) for name, pid in pids.items()} | {"load_generator": time.process_time()}
            result = summarize(samples, arms)
            used = {name: after[name] - before[name] for name in after}
            result["cpu"] = {  # shares of one core over the whole run (all arms' windows)
                "gateway_core_share": used["gateway"] / wall,
                "engines_core_share": sum(v for k, v in used.items() if k.startswith("engine")) / wall,
                "load_generator_core_share": used["load_generator"] / wall,
            }
            for arm in gateways:  # CPU per request it served
                result["cpu"][f"{arm}_ms_per_request"] = 1000 * used[arm] / max(1, result[arm]["requests"])
            result["gateway_memory_mib"] = {"start": memory_start["gateway"], "end": proc_memory_mib(pids["gateway"])}
            result["prefix_index_entries"] = (await gateway_health(gateway_ports["gateway"])).get(
                "prefix_index_entries"
            )
            result["loadavg"] = {"start": load_start, "end": Path("/proc/loadavg").read_text().split()[:3]}
            runs.append(result)
            print(json.dumps({"run": run, **result}), flush=True)
    return {"args": vars(args), "runs": runs, "summary": summary(runs)}


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    added = [r["added_ms"] for r in runs]
    out: dict[str, Any] = {
        f"added_{name}": {"median": statistics.median(a[name] for a in added), "worst": max(a[name] for a in added)}
        for name in ("ttft_p50_ms", "ttft_p99_ms", "e2e_p50_ms", "e2e_p99_ms")
    }
    out["errors"] = sum(r[arm]["errors"] for r in runs for arm in ("gateway", "baseline", "direct") if arm in r)
    if "baseline_added_ms" in runs[0]:
        base = [r["baseline_added_ms"] for r in runs]
        out["baseline_added_ttft_ms_median"] = {
            name: statistics.median(b[name] for b in base) for name in ("ttft_p50_ms", "ttft_p99_ms")
        }
    out["gateway_rss_mib_max"] = max(r["gateway_memory_mib"]["end"].get("VmRSS", 0.0) for r in runs)
    out["prefix_index_entries"] = [r["prefix_index_entries"] for r in runs]
    out["target_met_every_run"] = out["errors"] == 0 and all(  # errors of any arm fail it
        a["ttft_p50_ms"] <= 1.0 and a["ttft_p99_ms"] <= 5.0 for a in added
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=float, default=1000.0, help="arrivals per second in each arm's windows")
    parser.add_argument("--window-s", type=float, default=0.5, help="the arms take turns every this long")
    parser.add_argument("--duration-s", type=float, default=10.0, help="per arm (a run lasts arms x this)")
    parser.add_argument("--warmup-s", type=float, default=1.0, help="per arm, before each run")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--engines", type=int, default=2)
    parser.add_argument(
        "--speedup",
        type=float,
        default=20.0,
        help="the sim engines' pace (at 4, the 130-token prompts at 1,000 req/s overload two engines: their own "
        "queue, not the gateway, would then set the latency; at 20 the direct TTFT is a few ms)",
    )
    parser.add_argument("--max-tokens", type=int, default=16, help="output tokens per request")
    parser.add_argument("--router", default="prefix-affinity")
    parser.add_argument("--max-prefix-entries", type=int, default=20_000, help="the gateway's prefix index cap")
    parser.add_argument("--timeout-s", type=float, default=30.0)
    parser.add_argument(
        "--baseline-src",
        type=Path,
        help="a source tree (e.g. main's src/) for a second gateway, the baseline arm, taking its own turns",
    )
    parser.add_argument("--json", type=Path, help="write the results there too")
    args = parser.parse_args()
    try:  # the load generator, the engines and the gateway (uvicorn) all use uvloop when it is installed
        uvloop: Any = importlib.import_module("uvloop")
        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
        args.event_loop = "uvloop"
    except ImportError:
        args.event_loop = "asyncio"
    args.httptools = importlib.util.find_spec("httptools") is not None  # uvicorn's fast HTTP parser
    args.cpus = os.cpu_count()
    if (args.cpus or 0) < 4:
        sys.stderr.write(
            f"note: {args.cpus} CPUs: the gateway, {args.engines} engines and this load generator share them, so CPU "
            "queueing adds to both arms' tails (on 2 cores the added p99 measured 4.6-10.2 ms, on 16 cores "
            "0.96-3.4 ms; docs/serving.md section 10)\n"
        )
    result = asyncio.run(bench(args))
    print(json.dumps({"summary": result["summary"]}), flush=True)
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2, default=str) + "\n")


if __name__ == "__main__":
    main()
