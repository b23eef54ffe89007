"""What the GPU check's steps share: results, state between steps, the CLI, the API, nvidia-smi and NVML.

State between steps lives in $WORK/state.json; every check appends one line to $WORK/results.tsv (step, status
ok/fail/skip/info, detail), which the `summary` step turns into $OUT/summary.json. The steps talk to the server with
the CLI (`python -m tessera.cli ...`, $TESSERA_URL and $TESSERA_TOKEN) and, where the CLI has no JSON, with httpx.
"""

from __future__ import annotations

import contextlib
import csv
import importlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

WORK = Path(os.environ.get("WORK", "/tmp/gpu-check-work"))
OUT = Path(os.environ.get("OUT", "/tmp/gpu-check-out"))
SIM = os.environ.get("SIM") == "1"
SIM_GPUS = os.environ.get("SIM_GPUS", "1xH100-80GB")  # the simulated pool under SIM=1
PY = os.environ.get("PY", sys.executable)
URL = os.environ.get("TESSERA_URL", "")
TOKEN = os.environ.get("TESSERA_TOKEN", "")
HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
STATE = WORK / "state.json"
RESULTS = WORK / "results.tsv"
TERMINAL = {"succeeded", "failed", "cancelled", "preempted"}


def log(*parts: object) -> None:
    print(time.strftime("%H:%M:%S"), *parts, flush=True)


def record(step: str, status: str, detail: object = "") -> None:
    text = " ".join(str(detail).split())[:1500]
    with RESULTS.open("a") as f:
        f.write(f"{step}\t{status}\t{text}\n")
    log(f"RESULT {step}: {status.upper()} {text}")


def check(step: str, ok: bool, detail: object = "") -> bool:
    record(step, "ok" if ok else "fail", detail)
    return ok


def state() -> dict[str, Any]:
    return dict(json.loads(STATE.read_text())) if STATE.exists() else {}


def save(**kv: Any) -> None:
    s = state()
    s.update(kv)
    STATE.write_text(json.dumps(s, indent=1))


def sh(argv: list[str], timeout: float = 60, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    log("$", " ".join(argv))
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)
    except FileNotFoundError as exc:
        log("  not found:", exc)
        return subprocess.CompletedProcess(argv, 127, "", str(exc))
    except subprocess.TimeoutExpired as exc:
        log(f"  timed out after {timeout}s")
        return subprocess.CompletedProcess(argv, 124, str(exc.stdout or ""), str(exc.stderr or ""))
    for line in (p.stdout + p.stderr).rstrip().splitlines()[:60]:
        print("  |", line, flush=True)
    if p.returncode:
        log(f"  exit {p.returncode}")
    return p


def cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return sh([PY, "-m", "tessera.cli", *args], timeout=timeout, env={**os.environ, "COLUMNS": "160"})


def cli_json(*args: str, timeout: float = 60) -> Any:
    p = cli(*args, "--json", timeout=timeout)
    if p.returncode:
        raise RuntimeError(f"tessera {' '.join(args)} --json exited {p.returncode}: {p.stderr.strip()[:300]}")
    return json.loads(p.stdout)


def api(method: str, path: str, timeout: float = 30, **kw: Any) -> httpx.Response:
    return httpx.request(method, URL + path, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=timeout, **kw)


def smi(*args: str) -> list[list[str]]:
    """nvidia-smi --query-... --format=csv,noheader,nounits rows (empty in SIM mode or without nvidia-smi)."""
    if SIM:
        return []
    p = sh(["nvidia-smi", *args, "--format=csv,noheader,nounits"], timeout=20)
    if p.returncode:
        return []
    return [[c.strip() for c in row] for row in csv.reader(p.stdout.strip().splitlines()) if row]


def workload_pids() -> dict[int, list[int]]:
    """Workload id -> pids of the processes whose environment has TESSERA_WORKLOAD_ID (read from /proc, as root)."""
    out: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            env = (d / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        for item in env:
            if item.startswith(b"TESSERA_WORKLOAD_ID="):
                with contextlib.suppress(ValueError):
                    out.setdefault(int(item.split(b"=", 1)[1]), []).append(int(d.name))
    return out


def nvml_processes() -> list[dict[str, Any]]:
    """Compute processes as NVML lists them (pid, MiB, device UUID), read here directly."""
    if SIM:
        return []
    pynvml: Any = importlib.import_module("pynvml")
    pynvml.nvmlInit()
    rows: list[dict[str, Any]] = []
    for i in range(pynvml.nvmlDeviceGetCount()):
        h = pynvml.nvmlDeviceGetHandleByIndex(i)
        uuid = pynvml.nvmlDeviceGetUUID(h)
        for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h):
            used = p.usedGpuMemory
            rows.append({"pid": int(p.pid), "mib": None if used is None else int(used) >> 20, "uuid": str(uuid)})
    return rows


def smi_pids(rows: list[list[str]]) -> set[int]:
    """The pids of `nvidia-smi --query-compute-apps=pid,...` rows."""
    return {int(r[0]) for r in rows if r and r[0].isdigit()}


def workload(wid: int) -> dict[str, Any]:
    return dict(api("GET", f"/v1/workloads/{wid}").json())


def workloads() -> list[dict[str, Any]]:
    return list(api("GET", "/v1/workloads").json())


def wlog(wid: int) -> str:
    r = api("GET", f"/v1/workloads/{wid}/logs", params={"tail": 200})
    return str(r.json().get("data", "")) if r.status_code == 200 else f"<logs: {r.status_code} {r.text[:200]}>"


def wait(pred: Callable[[], bool], timeout: float, every: float = 1.0) -> bool:
    end = time.time() + timeout
    while time.time() < end:
        if pred():
            return True
        time.sleep(every)
    return bool(pred())


def submit(name: str, fraction: str, *wl_args: str) -> int:
    """Submit wl.py as a workload of ``fraction`` of a GPU; returns its id."""
    # A workload's environment is clean (PATH, HOME, USER, LANG): where the image finds libcuda through
    # LD_LIBRARY_PATH, a user passes it on, as here
    extra = ["--export", "LD_LIBRARY_PATH"] if os.environ.get("LD_LIBRARY_PATH") else []
    argv = ["submit", "--gpu-fraction", fraction, "--name", name, *extra, "--json", "--", PY, str(HERE / "wl.py")]
    p = cli(*argv, *wl_args)
    if p.returncode:
        raise RuntimeError(f"submit {name} failed: {p.stderr.strip()[:300]}")
    out = json.loads(p.stdout)
    out = out[0] if isinstance(out, list) else out
    log(f"submitted {name}: id {out['id']}")
    return int(out["id"])
