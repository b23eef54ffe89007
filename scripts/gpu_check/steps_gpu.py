"""The GPU check's first steps: imports, torch as a workload sees it, NVML discovery against nvidia-smi, MPS, nodes.

What Tessera should report is taken from nvidia-smi (name, UUID, memory, MIG mode), never from a GPU model named
here, so the check holds on any NVIDIA GPU. The expected catalog model is the catalog entry whose family is a word of
nvidia-smi's name, the closest in memory within that family (an unknown GPU is reported, not failed).
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import re
from pathlib import Path

from checklib import PY, SIM, SIM_GPUS, api, check, cli, cli_json, log, record, save, sh, smi, state
from tessera.core.catalog import all_models, resolve_model


def expected_model(smi_name: str, mem_mib: int) -> str | None:
    """The catalog model a GPU that nvidia-smi calls ``smi_name`` should get; None when no family is in the name."""
    words = [w for w in re.split(r"[^A-Z0-9]+", smi_name.upper()) if w]
    keys = set(words) | {a + b for a, b in zip(words, words[1:], strict=False)}
    family = [m for m in all_models() if m.disclosed and m.family.upper() in keys]
    if not family:
        return None
    return min(family, key=lambda m: abs(m.mem_mib - mem_mib)).name


def step_imports() -> None:
    mods = [
        "tessera.cli.main", "tessera.server.up", "tessera.cli.gateway_up", "tessera.server.memory_watch",
        "tessera.gpu.dcgm", "tessera.serving.engine_exec", "fastapi", "uvicorn", "sqlalchemy", "alembic",
        "scipy.optimize", "pynvml", "httptools", "uvloop", "openai",
    ]  # fmt: skip
    bad = []
    for m in mods:
        try:
            mod = importlib.import_module(m)
            log(f"import {m}: ok {getattr(mod, '__version__', '')} {getattr(mod, '__file__', '')}")
        except Exception as exc:
            bad.append(f"{m}: {type(exc).__name__}: {exc}")
            log(f"import {m}: FAILED {type(exc).__name__}: {exc}")
    check("imports.control_plane", not bad, "; ".join(bad) or f"{len(mods)} modules")


def step_torch() -> None:
    """The image's torch and transformers as a workload and the engine see them (torch: without the bundle)."""
    code = (
        "import torch; print('TORCH', torch.__version__, torch.version.cuda, torch.cuda.is_available(), "
        "torch.cuda.device_count(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else '-')"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    p = sh([PY, "-c", code], timeout=90, env=env)
    if SIM:
        record("torch.cuda", "skip", (p.stdout + p.stderr).strip()[-200:])
    else:
        check("torch.cuda", p.returncode == 0 and " True " in p.stdout, p.stdout.strip() or p.stderr.strip()[-300:])
    code = (
        "import transformers; from transformers.utils.import_utils import is_serve_available as s, "
        "is_accelerate_available as a; print('TRANSFORMERS', transformers.__version__, 'serve', s(), 'accelerate', a())"
    )
    p = sh([os.environ.get("MODEL_PY", PY), "-c", code], timeout=90, env=env)
    check(
        "transformers.serve_available",
        p.returncode == 0 and "serve True accelerate True" in p.stdout,
        p.stdout.strip() or p.stderr.strip()[-300:],
    )


def step_discover() -> None:
    logging.basicConfig(level=logging.INFO)
    from tessera.gpu.discovery import detect_gpus

    probe = detect_gpus(SIM_GPUS if SIM else "auto")
    devices = probe.devices()
    for d in devices:
        log("tessera device:", d)
    usage: list[object] = list(getattr(probe, "usage", list)())
    for u in usage:
        log("tessera usage:", u)
    save(
        devices=[
            {"uuid": d.uuid, "model": d.model, "mem_mib": d.mem_mib, "simulated": d.simulated,
             "product_name": d.product_name, "mig_parent_uuid": d.mig_parent_uuid}
            for d in devices
        ]
    )  # fmt: skip
    if SIM:
        sim_model = resolve_model(SIM_GPUS.split("x", 1)[-1]).name
        save(expected_models={d.uuid: sim_model for d in devices})
        check("discover.devices", len(devices) >= 1 and all(d.simulated for d in devices), f"SIM: {devices}")
        return
    rows = smi("--query-gpu=index,name,uuid,memory.total,mig.mode.current,driver_version")
    log("nvidia-smi rows:", rows)
    whole = [d for d in devices if not d.is_mig]
    check(
        "discover.real_not_simulated",
        bool(devices) and not any(d.simulated for d in devices),
        f"{len(devices)} device(s) from NVML",
    )
    expected: dict[str, str] = {}
    for row in rows:
        idx, name, uuid, mem, mig, driver = (row + [""] * 6)[:6]
        dev = next((x for x in devices if uuid in (x.uuid, x.mig_parent_uuid)), None)
        if dev is None:
            check(f"discover.gpu{idx}.found", False, f"nvidia-smi GPU {uuid} {name} not in Tessera's devices")
            continue
        check(f"discover.gpu{idx}.uuid", uuid in (dev.uuid, dev.mig_parent_uuid), f"{dev.uuid}")
        check(
            f"discover.gpu{idx}.name",
            dev.product_name == name or dev.is_mig,
            f"tessera {dev.product_name!r} smi {name!r}",
        )
        try:
            mem_mib = int(float(mem))
        except ValueError:
            mem_mib = -1
        check(
            f"discover.gpu{idx}.memory",
            dev.is_mig or abs(dev.mem_mib - mem_mib) <= 2,
            f"tessera {dev.mem_mib} MiB, smi {mem}",
        )
        want = expected_model(name, mem_mib)
        if want is None:
            record(f"discover.gpu{idx}.model", "info", f"{name!r} names no catalog family; Tessera chose {dev.model}")
        elif not dev.is_mig:
            check(f"discover.gpu{idx}.model", dev.model == want, f"catalog model {dev.model}, expected {want} ({name})")
        expected[dev.uuid] = dev.model if want is None or dev.is_mig else want
        mig_on = mig.strip().lower() == "enabled"
        check(
            f"discover.gpu{idx}.mig", mig_on == dev.is_mig, f"smi mig.mode.current={mig!r}, tessera is_mig={dev.is_mig}"
        )
        record("facts.driver", "info", f"driver {driver}; {name}; {mem} MiB; MIG {mig}")
    for d in devices:  # each MIG instance beyond the first of its GPU: as Tessera names it (MIG is not judged here)
        expected.setdefault(d.uuid, d.model)
    save(expected_models=expected)
    check(
        "discover.count",
        len(whole) == len(rows) or any(d.is_mig for d in devices),
        f"tessera {len(whole)} whole GPU(s), nvidia-smi {len(rows)}",
    )
    for u in usage:
        record("facts.nvml_usage", "info", f"{u}")


def step_mps() -> None:
    from tessera.gpu.isolation import DEFAULT_MPS_PIPE_DIR, mps_available

    found = mps_available()
    save(mps_daemon=found)
    procs = sh(["sh", "-c", "ps -eo pid,user,args | grep -i [m]ps-control || true"], timeout=10).stdout.strip()
    pipe = Path(DEFAULT_MPS_PIPE_DIR)
    record(
        "mps.daemon",
        "info",
        f"mps_available()={found}; pipe dir {pipe} exists={pipe.exists()}; "
        f"mps processes: {procs or 'none'} (Tessera only detects MPS, never starts it)",
    )


def step_nodes() -> None:
    expected: dict[str, str] = state().get("expected_models", {})
    p = cli("nodes")
    shown = sorted(set(expected.values()))
    check("nodes.table", p.returncode == 0 and all(m in p.stdout for m in shown), f"tessera nodes prints {shown}")
    nodes = cli_json("nodes")
    gpus = [g for n in nodes for g in n["gpus"]]
    save(gpu_uuids=[g["uuid"] for g in gpus])
    got = [(g["uuid"], g["model"], g["mem_mib"], g["simulated"]) for g in gpus]
    if SIM:
        check("nodes.gpus", bool(gpus) and all(g["simulated"] for g in gpus), f"{got}")
        return
    real = bool(gpus) and not any(g["simulated"] for g in gpus)
    models = all(expected.get(g["uuid"], g["model"]) == g["model"] for g in gpus)
    same = sorted(g["uuid"] for g in gpus) == sorted(d["uuid"] for d in state().get("devices", []))
    check("nodes.real_gpu", real and models and same, f"nodes: {got}; expected from nvidia-smi: {json.dumps(expected)}")
    health = api("GET", "/healthz").json()
    check("nodes.healthz_real", health.get("simulated_gpus") is False, f"healthz {health}")
