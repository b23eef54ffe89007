"""``tessera up --demo`` (what ``make run`` starts): once the server is ready, a model is deployed on the sim engine
(two replicas on quarter-GPU shares, behind the OpenAI-compatible gateway) and a small mix of workloads is submitted
through the HTTP API as tenant ``demo`` — shares of one GPU, a whole-GPU training job, a CPU-only job and one that has
to wait — and the commands to look at them (and a ``curl`` and an ``openai`` example) are printed. The demo's
workloads are stopped, and its model deleted, when the server stops.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

import httpx

DEMO_TENANT = "demo"
DEMO_RUNTIME_S = 600  # every demo workload ends by itself after this long
SUGGESTED_SHARE = 0.2  # the share of the submission the demo suggests: it fits beside the mix
DEMO_MODEL: dict[str, Any] = {
    "name": "demo-chat",
    "engine": "sim",
    "model": "llama3-8b",
    "gpu_fraction": 0.25,
    "min_replicas": 2,
    "max_replicas": 3,
    "slo": "interactive",
}


def _python(script: str) -> list[str]:
    return [sys.executable, "-u", "-c", script]


_TRAIN = (
    "import os, time\n"
    "print('training on', os.environ['CUDA_VISIBLE_DEVICES'] or 'the CPU')\n"
    f"for step in range(1, {DEMO_RUNTIME_S // 2} + 1):\n"
    "    time.sleep(2); print(f'step {step} loss {2.5 / step ** 0.5:.3f}')\n"
)


def demo_mix(gpus: int) -> list[dict[str, Any]]:
    """Bodies for ``POST /v1/workloads``; sized so that on ``gpus`` GPUs the last one waits for room."""
    mix: list[dict[str, Any]] = [
        # 0.3 beside the model's two 0.25 replicas: 0.2 of that GPU stays free for the submission the demo suggests
        # (SUGGESTED_SHARE), too little for a third replica or for eval-waits' 0.6.
        {"name": "finetune", "gpus": 1, "gpu_fraction": 0.3, "command": _python(_TRAIN), "priority": "training"},
        {"name": "preprocess", "cpu": 0.5, "command": _python(_TRAIN.replace("step", "shard"))},
    ]
    mix += [
        {"name": f"pretrain-{i}", "gpus": 1, "command": _python(_TRAIN), "priority": "training"}
        for i in range(max(0, gpus - 1))
    ]
    mix.append(
        {"name": "eval-waits", "gpus": 1, "gpu_fraction": 0.6, "command": _python(_TRAIN), "priority": "best-effort"}
    )
    return mix


def submit_demo(url: str, token: str, gpus: int, announce: Callable[[str], None], timeout_s: float = 30.0) -> list[int]:
    """Wait for the server, submit the mix through the API, and print what to try; returns the workload ids."""
    headers = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=url, headers=headers, timeout=10) as http:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if http.get("/healthz").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                announce("demo: the server did not become ready; nothing submitted")
                return []
            time.sleep(0.1)
        ids = _deploy_model(http)
        for body in demo_mix(gpus):
            response = http.post("/v1/workloads", json=body)
            response.raise_for_status()
            ids.append(int(response.json()["id"]))
        waiting = _a_waiting_one(http, ids)
    announce(_instructions(url, token, ids, waiting))
    return ids


def _deploy_model(http: httpx.Client, timeout_s: float = 10.0) -> list[int]:
    """Deploy the demo's model (two replicas of the sim engine, a quarter of a GPU each) and wait until its replica
    workloads exist, so that they are in line before the rest of the mix; returns their ids."""
    deployed = http.post("/v1/models", json=DEMO_MODEL)
    if deployed.status_code != 409:  # 409: still deployed by an earlier demo on this data directory
        deployed.raise_for_status()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        replicas: list[int] = http.get(f"/v1/models/{DEMO_MODEL['name']}").json()["replica_workloads"]
        if len(replicas) >= DEMO_MODEL["min_replicas"]:
            return sorted(replicas)
        time.sleep(0.1)
    return []


def _a_waiting_one(http: httpx.Client, ids: list[int], timeout_s: float = 3.0) -> int:
    """The demo workload that still waits once the scheduler has seen the mix (the last one if none is found)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        rows = {int(w["id"]): w for w in http.get("/v1/workloads").json()}
        states = [rows[i]["state"] for i in ids if i in rows]
        if len(states) == len(ids) and states.count("pending") == 1:
            return next(i for i in ids if rows[i]["state"] == "pending")
        time.sleep(0.2)
    return ids[-1]


def _instructions(url: str, token: str, ids: list[int], waiting: int) -> str:
    return "\n".join(
        [
            f"demo: submitted workloads {ids[0]}..{ids[-1]} as tenant '{DEMO_TENANT}'. Try, in another terminal:",
            f"  export TESSERA_URL={url} TESSERA_TOKEN={token}",
            "  .venv/bin/tessera jobs            # what runs and what waits (and why)",
            "  .venv/bin/tessera nodes           # per-GPU allocation (simulated GPUs are labelled)",
            f"  .venv/bin/tessera show {waiting}          # why this one waits",
            f"  .venv/bin/tessera logs {ids[0]} -f       # a replica's output as it comes",
            f"  .venv/bin/tessera submit --gpu-fraction {SUGGESTED_SHARE} -- python3 -c 'print(42)'  # fits beside",
            "  .venv/bin/tessera history         # accounting: start, end, wait, GPU-hours, where it ran",
            "  .venv/bin/tessera models          # the demo's model: two sim-engine replicas on GPU shares",
            f"  curl -s {url}/openai/v1/chat/completions -H 'Authorization: Bearer {token}' \\",
            f'    -H \'Content-Type: application/json\' -d \'{{"model": "{DEMO_MODEL["name"]}", '
            '"messages": [{"role": "user", "content": "Hello!"}]}\'',
            f"  .venv/bin/python -c \"import openai; c = openai.OpenAI(base_url='{url}/openai/v1', api_key='{token}'); "
            f"print(c.chat.completions.create(model='{DEMO_MODEL['name']}', "
            "messages=[{'role': 'user', 'content': 'Hello!'}]).choices[0].message.content)\"",
            f"  curl -s {url}/metrics | grep tessera_   # Prometheus metrics;  API docs: {url}/docs",
            "Stop with Ctrl-C (the demo's workloads are stopped with the server).",
        ]
    )
