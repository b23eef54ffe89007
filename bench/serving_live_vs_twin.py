"""The serving twin against the live gateway: the same requests, the same setup, the same pool, side by side.

The first ``--minutes`` of a request trace (Azure format; default the shared conversation trace), split into
``--models`` models by the twin's own split (``build_workload``: Zipf popularity, rotated copies, SLO classes), at
``--load`` times its rate, is

1. replayed through the twin (``Twin``) with the serving setup ``--setup`` (and its ``--set`` knobs) on the pool
   ``--gpus``, as live runs it (``AS_LIVE``: sharing ``isolated``, for sim engines on simulated GPUs never slow
   each other; no adaptive sizing; tensor-parallel replicas on whole GPUs); and
2. sent, in real time, to a live ``tessera up --gpus POOL --serving-setup SETUP --placement bestfit`` with the same
   knobs: each model deployed as a sim engine of its catalog model (timed by the same performance model, its KV
   cache what the twin's replica shape leaves: ``--gpu-mem`` of the shape; weights loaded as the twin's warm start),
   at ``--min-replicas 0``, ``--slo interactive`` (the twin's zero budget), one warm-up request each before the
   clock starts (the twin starts every model with one replica). Each request is a streamed completion of the
   trace's prompt length (words that count one token each), ``max_tokens`` its output length, its SLO class in
   ``x-tessera-slo``; TTFT and TPOT are timed at the client.

GPU-seconds: the twin's integral of GPUs holding a replica over the window; live, the same integral from the replica
workloads' placements and their start and end times (``GET /v1/workloads``). SLO attainment: a request meets its
SLO when served with TTFT and TPOT within its class's targets (a refused one misses), as the twin counts.

``--old`` also runs the live gateway as it was before the setups (least-load, no late binding, no admission) against
the same twin. Scaling the load down for two cores: ``--load`` thins the trace (the twin's own ``load``), and the
live server runs as this user (``--run-as server``). Prints a table and, last, one JSON line::

    {"requests": int, "gpu_seconds_live": float, "gpu_seconds_twin": float, "gpu_seconds_rel_err_pct": float,
     "ttft_p50_rel_err_pct": float, "ttft_p99_rel_err_pct": float, "slo_live_pct": float, "slo_twin_pct": float}

    PYTHONPATH=src .venv/bin/python bench/serving_live_vs_twin.py --minutes 10 --models 4 [--load 0.5] [--old]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from tessera.client.http import TesseraClient, wait_healthy
from tessera.serving.policies.requests import DEFAULT_SLO_TARGETS, InferenceRequest
from tessera.serving.setups import PolicySetup, serving_setup, with_setup_knobs
from tessera.serving.sizing import replica_shape
from tessera.sim.serving.config import parse_gpu_cluster
from tessera.sim.serving.perf_choice import make_perf_factory
from tessera.sim.serving.study import nodes_for
from tessera.sim.serving.trace import read_llm_trace
from tessera.sim.serving.twin import Twin, TwinInputs
from tessera.sim.serving.workload import Workload, build_workload

DEFAULT_TRACE = Path(__file__).resolve().parents[2] / "shared/traces/azure-llm/AzureLLMInferenceTrace_conv.csv"
ADMIN = "serving-live-vs-twin-admin-token-0123456789"
OLD_KNOBS = ("router=least-load", "late_binding=false", "admission=false")  # the live gateway before the setups
# What live cannot do yet, so the twin must not either: sim engines on simulated GPUs never slow each other; a
# replica keeps the share it was deployed with; a tensor-parallel replica takes whole GPUs.
AS_LIVE = ("sharing=isolated", "adaptive=false", "shared_gangs=false")
WORDS = ("the", "and", "for", "was", "are", "his", "but", "you", "her", "she", "one", "all", "has", "can", "not")
BLOCK_WORDS = 16  # a prefix block of the twin (~16 tokens), ~64 characters: the gateway's prefix block


# ------------------------------------------------------------------------------------------------------ the twin
def workload_of(args: argparse.Namespace) -> Workload:
    trace = read_llm_trace(args.trace)
    whole = build_workload(trace, args.models, 1.0, args.load, args.seed)
    horizon = args.minutes * 60.0
    kept = [r for r in whole.requests if r.arrival_s < horizon]  # a prefix: the requests are sorted by arrival
    counts = {m.name: sum(r.model == m.name for r in kept) for m in whole.models}
    return Workload(kept, whole.models, horizon, counts, whole.trace_rows[: len(kept)])


def twin_run(workload: Workload, setup: PolicySetup, gpus: str, seed: int) -> dict[str, Any]:
    cluster = parse_gpu_cluster(gpus)
    nodes = nodes_for(cluster.count, cluster)
    models = {m.name: m.spec for m in workload.models}
    inputs = TwinInputs(workload.requests, models, workload.duration_s, nodes, make_perf_factory())
    run = Twin(inputs, setup, seed).run()
    return {
        "gpu_seconds": run.gpu_hours * 3600.0,
        "ttft_s": np.asarray(run.ttft_s, dtype=np.float64),
        "slo_pct": run.slo_attainment_pct,
        "dropped": run.dropped,
        "requests": run.requests,
    }


# ------------------------------------------------------------------------------------------------------- live
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class LiveServer:
    data: Path
    gpus: str
    setup: str
    knobs: tuple[str, ...]
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        command = [sys.executable, "-m", "tessera.cli", "up", "--port", str(self.port), "--gpus", self.gpus]
        command += ["--data-dir", str(self.data), "--run-as", "server", "--placement", "bestfit"]
        command += ["--serving-setup", self.setup]
        for knob in self.knobs:
            command += ["--serving-set", knob]
        self.data.mkdir(parents=True, exist_ok=True)
        log = (self.data / "server.log").open("ab")
        env = {**os.environ, "TESSERA_ADMIN_TOKEN": ADMIN}
        self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        wait_healthy(self.url, 60, self.process.poll)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)


def prompt_text(request: InferenceRequest) -> str:
    """``prompt_tokens`` words of one token each; its leading blocks follow the twin's prefix hashes, so requests
    that share a prefix in the twin share their leading text here (what prefix-affinity routing matches)."""
    words: list[str] = []
    for block in request.prefix:
        words += [WORDS[(block >> (2 * k)) % len(WORDS)] for k in range(BLOCK_WORDS)]
    words = words[: max(0, request.prompt_tokens - 2)]
    tail = request.prompt_tokens - len(words) - 2
    words += [WORDS[(request.id * 7 + k) % len(WORDS)] for k in range(max(0, tail))]
    return " ".join([*words, "request", str(request.id)])


@dataclass
class Answer:
    status: int
    ttft_s: float | None = None
    tpot_s: float | None = None


async def send_one(client: httpx.AsyncClient, model: str, request: InferenceRequest) -> Answer:
    body = {
        "model": model, "prompt": prompt_text(request), "max_tokens": request.output_tokens, "stream": True,
    }  # fmt: skip
    headers = {"x-tessera-slo": request.slo.name.lower()}
    start = time.monotonic()
    first = last = None
    chunks = 0
    try:
        async with client.stream("POST", "/openai/v1/completions", json=body, headers=headers) as response:
            if response.status_code != 200:
                await response.aread()
                return Answer(response.status_code)
            async for line in response.aiter_lines():
                if line.startswith("data: {") and '"text"' in line:
                    now = time.monotonic()
                    first = now if first is None else first
                    last = now
                    chunks += 1
    except httpx.HTTPError:
        return Answer(599)
    if first is None or last is None:
        return Answer(598)
    return Answer(200, first - start, (last - first) / (chunks - 1) if chunks > 1 else None)


async def replay(url: str, token: str, workload: Workload) -> tuple[list[Answer], float]:
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=200)
    timeout = httpx.Timeout(900.0, connect=30.0)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=timeout, headers=_auth(token)) as client:
        t0 = time.monotonic()
        wall0 = time.time()

        async def at(request: InferenceRequest) -> Answer:
            await asyncio.sleep(max(0.0, t0 + request.arrival_s - time.monotonic()))
            return await send_one(client, request.model, request)

        answers = await asyncio.gather(*(at(r) for r in workload.requests))
    return list(answers), wall0


def _auth(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


def deploy_models(client: TesseraClient, workload: Workload, setup: PolicySetup, gpu_model: str) -> None:
    for served in workload.models:
        spec = served.spec
        shape = replica_shape(spec, gpu_model, setup.sizing)
        body: dict[str, Any] = {
            "name": served.name, "engine": "sim", "model": spec.name, "gpus": shape.gpus, "min_replicas": 0,
            "max_replicas": 16, "idle_timeout": "30s", "slo": "interactive", "queue": "bench",
        }  # fmt: skip
        if shape.shared:
            body["gpu_mem"] = f"{shape.request.gpu_mem_mib}MiB"
        client.deploy_model(body)


def warm_up(url: str, token: str, workload: Workload) -> None:
    """One short request per model, so that each has a replica when the clock starts (the twin starts so)."""
    with httpx.Client(base_url=url, headers=_auth(token), timeout=300.0) as client:
        for served in workload.models:
            body = {"model": served.name, "prompt": "warm up", "max_tokens": 2}
            response = client.post("/openai/v1/completions", json=body)
            response.raise_for_status()


def gpu_seconds_live(client: TesseraClient, start_s: float, end_s: float) -> float:
    """The integral over [start_s, end_s] of GPUs holding at least one replica workload (loading or ready)."""
    spans: dict[str, list[tuple[float, float]]] = {}
    for w in client.workloads():
        if w["kind"] != "service" or w["started_at"] is None or not w["placement"]:
            continue
        begin = max(start_s, w["started_at"])
        end = min(end_s, w["finished_at"] if w["finished_at"] is not None else end_s)
        if end <= begin:
            continue
        for part in w["placement"]:
            for uuid in part["uuids"]:
                spans.setdefault(uuid, []).append((begin, end))
    total = 0.0
    for intervals in spans.values():
        intervals.sort()
        cur_begin, cur_end = intervals[0]
        for begin, end in intervals[1:]:
            if begin > cur_end:
                total += cur_end - cur_begin
                cur_begin, cur_end = begin, end
            else:
                cur_end = max(cur_end, end)
        total += cur_end - cur_begin
    return total


def live_run(workload: Workload, setup_name: str, knobs: tuple[str, ...], gpus: str, root: Path) -> dict[str, Any]:
    setup = with_setup_knobs(serving_setup(setup_name), (*knobs, *AS_LIVE))  # the replica shapes deployed
    server = LiveServer(root, gpus, setup_name, knobs)
    server.start()
    try:
        with TesseraClient(server.url, ADMIN) as admin:
            token = admin.create_token("bench", "serving-live-vs-twin")["token"]
        with TesseraClient(server.url, token) as client:
            deploy_models(client, workload, setup, parse_gpu_cluster(gpus).model.name)
        warm_up(server.url, token, workload)
        answers, wall0 = asyncio.run(replay(server.url, token, workload))
        with TesseraClient(server.url, ADMIN) as admin:
            gpu_s = gpu_seconds_live(admin, wall0, wall0 + workload.duration_s)
    finally:
        server.stop()
    met = 0
    ttfts: list[float] = []
    for request, answer in zip(workload.requests, answers, strict=True):
        if answer.status != 200 or answer.ttft_s is None:
            continue
        ttfts.append(answer.ttft_s)
        target = DEFAULT_SLO_TARGETS[request.slo]
        if answer.ttft_s <= target.ttft_s and (answer.tpot_s is None or answer.tpot_s <= target.tpot_s):
            met += 1
    refused = sum(a.status != 200 for a in answers)
    return {
        "gpu_seconds": gpu_s,
        "ttft_s": np.asarray(ttfts, dtype=np.float64),
        "slo_pct": 100.0 * met / max(1, len(answers)),
        "dropped": refused,
        "requests": len(answers),
    }


# ------------------------------------------------------------------------------------------------------ report
def rel_err_pct(live: float, twin: float) -> float:
    return round(100.0 * abs(live - twin) / twin, 2) if twin else float("inf")


def pct(values: np.ndarray, q: float) -> float:
    return float(np.percentile(values, q)) if values.size else float("nan")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--models", type=int, default=4)
    parser.add_argument("--load", type=float, default=0.5, help="multiple of the trace's rate (the twin's --load)")
    parser.add_argument("--gpus", default="8xH100-80GB", help="the pool of both (simulated GPUs live)")
    parser.add_argument("--setup", default="tessera")
    parser.add_argument("--set", dest="knobs", action="append", default=[], help="a setup knob KEY=VALUE (repeat)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--old", action="store_true", help="also run the live gateway as it was (least-load, no queue)")
    parser.add_argument("--data", type=Path, default=None, help="where the live servers keep their data")
    args = parser.parse_args(argv)
    if not args.trace.is_file():
        parser.exit(2, f"--trace: no such file: {args.trace}\n")
    workload = workload_of(args)
    knobs = tuple(args.knobs)
    twin_setup = with_setup_knobs(serving_setup(args.setup), (*knobs, *AS_LIVE))
    names = ", ".join(m.name for m in workload.models)
    rate = len(workload.requests) / workload.duration_s
    print(
        f"{len(workload.requests)} requests over {args.minutes:g} min ({rate:.2f}/s), {args.models} models ({names}), "
        f"load {args.load:g}x, pool {args.gpus}, setup {args.setup}{' with ' + ', '.join(knobs) if knobs else ''}",
        flush=True,
    )
    twin = twin_run(workload, twin_setup, args.gpus, args.seed)
    root = args.data or Path(tempfile.mkdtemp(prefix="tessera-live-vs-twin-"))
    arms = [("live", knobs)] + ([("live, old gateway", (*knobs, *OLD_KNOBS))] if args.old else [])
    rows: list[tuple[str, dict[str, Any]]] = [("twin", twin)]
    for label, arm_knobs in arms:
        began = time.monotonic()
        rows.append((label, live_run(workload, args.setup, arm_knobs, args.gpus, root / label.replace(", ", "-"))))
        print(f"{label}: {time.monotonic() - began:.0f} s", flush=True)
    print("\n| run | GPU-s | TTFT p50 s | TTFT p99 s | SLO % | refused |\n|---|---:|---:|---:|---:|---:|")
    for label, r in rows:
        print(
            f"| {label} | {r['gpu_seconds']:.0f} | {pct(r['ttft_s'], 50):.3f} | {pct(r['ttft_s'], 99):.3f} | "
            f"{r['slo_pct']:.2f} | {r['dropped']} |"
        )
    summaries = []
    for label, r in rows[1:]:
        summaries.append(
            {
                "run": label,
                "requests": len(workload.requests),
                "gpu_seconds_live": round(r["gpu_seconds"], 1),
                "gpu_seconds_twin": round(twin["gpu_seconds"], 1),
                "gpu_seconds_rel_err_pct": rel_err_pct(r["gpu_seconds"], twin["gpu_seconds"]),
                "ttft_p50_rel_err_pct": rel_err_pct(pct(r["ttft_s"], 50), pct(twin["ttft_s"], 50)),
                "ttft_p99_rel_err_pct": rel_err_pct(pct(r["ttft_s"], 99), pct(twin["ttft_s"], 99)),
                "slo_live_pct": round(r["slo_pct"], 2),
                "slo_twin_pct": round(twin["slo_pct"], 2),
            }
        )
    for extra in summaries[1:]:
        print(json.dumps(extra))
    print(json.dumps({k: v for k, v in summaries[0].items() if k != "run"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
