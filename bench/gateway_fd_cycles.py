"""Does ``tessera up`` keep its file descriptors through models that come and go? (issue 25, defect 3)

A real ``tessera up`` (simulated GPUs; as root its default: one OS user per tenant) serves a tenant's sim model
through its gateway; each cycle deploys the model, waits until it is ready, streams ``--streams`` chat completions
at once through the gateway (the official wire format, SSE), then deletes the model and waits until its replica
has ended. The server's open descriptors (``/proc/PID/fd``) are counted before the first cycle and after each.

Before the fix, pooled connections to replicas that had gone stayed open in CLOSE_WAIT: three cycles of 900 streams
exhausted a 2,500-descriptor limit. The goal: after ``--cycles`` cycles at most ``--slack`` descriptors more than
before, and no failed stream.

Prints a line per cycle, then one JSON line (``{"cycles", "streams", "errors", "fds_before", "fds_after",
"fds_max", "within_slack"}``). Exit status 1 when a stream failed or the descriptors grew past the slack.

Usage: ``python bench/gateway_fd_cycles.py [--cycles 20] [--streams 500] [--max-tokens 8] [--slack 50]
[--run-as auto|server|tenant-users]``.
Linux only (``/proc``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import httpx

from bench_api_load import Server, tessera_up

MODEL = "fdcycle"
TENANT = "fdbench"


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def wait_until(what: str, check: object, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return
        time.sleep(0.2)
    raise RuntimeError(f"timed out waiting for {what}")


async def stream_all(url: str, token: str, streams: int, max_tokens: int) -> int:
    """``streams`` streamed chat completions at once; how many failed (not 200, or no [DONE])."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "count"}], "max_tokens": max_tokens}
    body["stream"] = True
    limits = httpx.Limits(max_connections=streams, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=url, timeout=300, limits=limits) as client:

        async def one() -> bool:
            headers = {"authorization": f"Bearer {token}"}
            async with client.stream("POST", "/openai/v1/chat/completions", json=body, headers=headers) as answer:
                text = "".join([chunk async for chunk in answer.aiter_text()])
                return answer.status_code == 200 and "[DONE]" in text and '"error"' not in text

        done = await asyncio.gather(*(one() for _ in range(streams)), return_exceptions=True)
    return sum(result is not True for result in done)


def cycle(server: Server, admin: httpx.Client, token: str, streams: int, max_tokens: int) -> int:
    tenant = httpx.Client(base_url=server.url, headers={"authorization": f"Bearer {token}"}, timeout=60)
    with tenant:
        deployed = tenant.post("/v1/models", json={"name": MODEL, "engine": "sim", "gpu_fraction": 0.25})
        deployed.raise_for_status()
        wait_until("the model to be ready", lambda: tenant.get(f"/v1/models/{MODEL}").json()["state"] == "ready")
        errors = asyncio.run(stream_all(server.url, token, streams, max_tokens))
        tenant.delete(f"/v1/models/{MODEL}").raise_for_status()
        wait_until("the model to be gone", lambda: tenant.get(f"/v1/models/{MODEL}").status_code == 404)
        wait_until(
            "its replica to end",
            lambda: not admin.get("/v1/workloads", params={"state": ["running", "pending"]}).json(),
        )
    return errors


def run(cycles: int, streams: int, max_tokens: int, run_as: str = "auto") -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="tessera-fd-", dir="/tmp") as scratch:
        os.chmod(scratch, 0o755)  # tenants' users must reach their homes inside
        with tessera_up(Path(scratch) / "data", run_as=run_as) as server:
            admin = httpx.Client(base_url=server.url, headers={"authorization": f"Bearer {server.token}"}, timeout=60)
            with admin:
                token = admin.post("/v1/tokens", json={"tenant": TENANT}).json()["token"]
                before = open_fds(server.process.pid)
                counts, errors = [], 0
                for number in range(1, cycles + 1):
                    failed = cycle(server, admin, token, streams, max_tokens)
                    errors += failed
                    counts.append(open_fds(server.process.pid))
                    print(
                        f"cycle {number}: {streams} streams, {failed} failed, server fds {counts[-1]} (before {before})"
                    )
    return {"cycles": cycles, "streams": streams, "errors": errors, "fds_before": before, "fds_after": counts[-1],
            "fds_max": max(counts)}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=20)
    parser.add_argument("--streams", type=int, default=500)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--slack", type=int, default=50, help="descriptors the server may hold more at the end")
    parser.add_argument("--run-as", default="auto", help="tessera up --run-as (auto: tenant users as root)")
    args = parser.parse_args(argv)
    result = run(args.cycles, args.streams, args.max_tokens, args.run_as)
    result["within_slack"] = int(result["fds_after"]) <= int(result["fds_before"]) + args.slack  # type: ignore[call-overload]
    print(json.dumps(result))
    return 0 if result["within_slack"] and not result["errors"] else 1


if __name__ == "__main__":
    sys.exit(main())
