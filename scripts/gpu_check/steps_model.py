"""The GPU check's last steps: a tiny random Llama on `--engine transformers` through the gateway, then cleanup,
strays (workloads outlive the server by design) and the summary."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import httpx

from checklib import (
    OUT,
    PY,
    RESULTS,
    ROOT,
    SIM,
    TOKEN,
    WORK,
    check,
    cli,
    cli_json,
    log,
    nvml_processes,
    sh,
    smi,
    smi_pids,
    state,
    wait,
    wlog,
    workload,
    workload_pids,
    workloads,
)


def _first_model() -> dict[str, Any]:
    models = cli_json("models", timeout=30) or [{}]
    return dict(models[0])


def step_model() -> None:
    model_py = os.environ.get("MODEL_PY", PY)
    tiny = WORK / "tiny"
    pythonpath = os.environ.get("ENGINE_PYTHONPATH", "") + ":" + str(ROOT / "src")
    p = sh([model_py, "-m", "tessera.serving.tiny_model", "--out", str(tiny)], timeout=90,
           env={**os.environ, "PYTHONPATH": pythonpath})  # fmt: skip
    if not check("model.tiny_made", p.returncode == 0 and (tiny / "config.json").exists(), p.stderr.strip()[-300:]):
        return
    for path in [tiny, *tiny.rglob("*")]:  # transformers writes its shards 0600: a tenant's user must read them
        path.chmod(0o755 if path.is_dir() else 0o644)
    p = cli("models", "deploy", "tiny", "--engine", "transformers", "--model", str(tiny), "--gpu-fraction", "0.1",
            "--min-replicas", "1", "--json")  # fmt: skip
    if not check("model.deployed", p.returncode == 0, (p.stdout + p.stderr).strip()[-300:]):
        return
    base = json.loads(p.stdout)["openai_base_url"]
    up = wait(lambda: int(_first_model().get("replicas", 0)) >= 1, 120, 3)
    model = _first_model()
    log("model:", model)
    check("model.replica_running", up, f"replicas {model.get('replicas')}")
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8}
    t0 = time.time()
    try:
        r = httpx.post(base + "/chat/completions", json=body, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=100)
        log(f"chat: {r.status_code} in {time.time() - t0:.1f}s: {r.text[:600]}")
        ok = r.status_code == 200 and "choices" in r.json()
        text = r.json()["choices"][0]["message"]["content"] if ok else r.text[:300]
    except Exception as exc:
        ok, text = False, f"{type(exc).__name__}: {exc}"
    check("model.chat", ok, f"through {base}: {text!r} in {time.time() - t0:.1f}s")
    reps = _first_model().get("replica_workloads", [])
    log("replica workloads:", reps)
    if reps:
        rid = int(reps[0]["id"] if isinstance(reps[0], dict) else reps[0])
        w = workload(rid)
        log(f"replica {rid}: {w['state']} placement={w['placement']}")
        print(wlog(rid)[-4000:], flush=True)
        if not SIM:
            mine = set(workload_pids().get(rid, []))
            rows = smi("--query-compute-apps=pid,used_memory,gpu_uuid")
            nv = nvml_processes()
            seen = smi_pids(rows) | {p["pid"] for p in nv}
            check(
                "model.engine_on_gpu", bool(mine & seen), f"replica pids {sorted(mine)}; nvidia-smi {rows}; NVML {nv}"
            )
    p = cli("models", "delete", "tiny")
    check("model.deleted_cmd", p.returncode == 0, (p.stdout + p.stderr).strip()[-200:])

    def stopped() -> bool:
        return not any(
            w["state"] in ("running", "pending") for w in workloads() if str(w.get("name", "")).startswith("tiny")
        )

    gone = wait(stopped, 40, 2)
    check("model.replicas_stopped", gone, f"{[(w['id'], w['name'], w['state']) for w in workloads()]}")


def step_cleanup() -> None:
    try:
        cli("cancel", "--state", "running", "--state", "pending", timeout=20)
        wait(lambda: not any(w["state"] in ("running", "pending") for w in workloads()), 20, 1)
        cli("jobs", "--all")
    except Exception as exc:
        log("cleanup via the API failed:", exc)


def step_strays() -> None:
    me = {os.getpid(), os.getppid()}
    found: dict[int, str] = {}
    for pids in workload_pids().values():
        for pid in pids:
            found[pid] = "TESSERA_WORKLOAD_ID"
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                args = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if f"{WORK}/" in args and "gpu_check.sh" not in args and "check.py" not in args:
                found[int(d.name)] = args[:200]
    found = {p: why for p, why in found.items() if p not in me}
    if not found:
        check("cleanup.strays", True, "no workload process left")
        return
    groups = set()
    for pid, why in found.items():
        with contextlib.suppress(OSError):
            groups.add(os.getpgid(pid))
        log(f"left: pid {pid}: {why}")
    for g in groups:
        if g > 1 and g != os.getpgid(0):
            with contextlib.suppress(OSError):
                os.killpg(g, signal.SIGKILL)
    check(
        "cleanup.strays",
        False,
        f"{len(found)} process(es) left after the server stopped: killed groups {sorted(groups)}",
    )


def step_summary() -> None:
    rows = [ln.split("\t", 2) for ln in RESULTS.read_text().splitlines()] if RESULTS.exists() else []
    results = [{"check": r[0], "status": r[1], "detail": r[2] if len(r) > 2 else ""} for r in rows if len(r) >= 2]
    counts: dict[str, int] = {}
    for r in results:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    failed = [r["check"] for r in results if r["status"] == "fail"]
    summary = {"sim": SIM, "counts": counts, "failed": failed, "results": results, "state": state()}
    (OUT / "summary.json").write_text(json.dumps(summary, indent=1))
    log(f"SUMMARY {counts}; failed: {failed}")
