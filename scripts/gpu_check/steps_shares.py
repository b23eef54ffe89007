"""The GPU check's sharing steps: two 0.25 shares at once, the NVML watchdog stopping a hog, DCGM metrics, cancel.

The memory totals are checked against nvidia-smi's memory.total, not a figure for one GPU model.
"""

from __future__ import annotations

import json
import re
import time

from checklib import (
    SIM,
    TERMINAL,
    WORK,
    api,
    check,
    cli,
    log,
    nvml_processes,
    record,
    save,
    smi,
    smi_pids,
    state,
    submit,
    wait,
    wlog,
    workload,
    workload_pids,
)


def _uuids(w: dict[str, object]) -> list[str]:
    placement = w.get("placement") or []
    return (
        [u for pl in placement if isinstance(pl, dict) for u in pl.get("uuids", [])]
        if isinstance(placement, list)
        else []
    )


def step_shares() -> None:
    a = submit("share-a", "0.25", "0.7", "0", "150")  # 70 % of the allowance each, held 150 s
    b = submit("share-b", "0.25", "0.7", "0", "150")
    save(share_ids=[a, b])
    markers = ("ALLOCATED", "NO_TORCH", "NO_CUDA")
    ready = wait(
        lambda: all(any(m in wlog(w) for m in markers) or workload(w)["state"] in TERMINAL for w in (a, b)), 90, 1.5
    )
    wa, wb = workload(a), workload(b)
    la, lb = wlog(a), wlog(b)
    for w, text in ((wa, la), (wb, lb)):
        log(f"workload {w['id']} {w['state']} reason={w['reason']!r} placement={w['placement']}")
        print(text[-3000:], flush=True)
    check(
        "shares.both_running", ready and wa["state"] == wb["state"] == "running", f"states {wa['state']}, {wb['state']}"
    )
    uuids = state().get("gpu_uuids", [])
    ua, ub = _uuids(wa), _uuids(wb)
    check("shares.same_gpu", bool(ua) and ua == ub and len(uuids) == 1, f"share-a on {ua}, share-b on {ub}")
    both_alloc = "ALLOCATED" in la and "ALLOCATED" in lb
    check("shares.allocated", both_alloc or SIM, re.findall(r"ALLOCATED[^\n]*", la + lb) or "no ALLOCATED line")
    for wid, text in ((a, la), (b, lb)):
        m = re.search(r"WLENV (\{.*\})", text)
        env = json.loads(m.group(1)) if m else {}
        cvd = env.get("CUDA_VISIBLE_DEVICES")
        check(f"shares.{wid}.cvd_is_uuid", cvd is not None and cvd in uuids, f"CUDA_VISIBLE_DEVICES={cvd} gpus={uuids}")
        record(f"facts.env.{wid}", "info", json.dumps(env))
        if state().get("mps_daemon"):  # an MPS daemon serves the GPU: the share's limits are MPS's own
            mem = env.get("TESSERA_GPU_MEM_MIB")
            limits = (env.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"), env.get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"))
            check(f"shares.{wid}.mps_limits", limits == ("25", f"0={mem}M"), f"MPS limits {limits}, allowance {mem}")
    if SIM:
        return
    pids = workload_pids()
    procs = nvml_processes()
    rows = smi("--query-compute-apps=pid,used_memory,gpu_uuid")
    log("workload pids:", pids, "NVML processes:", procs, "nvidia-smi compute apps:", rows)
    nvml_pids = {p["pid"] for p in procs}
    listed = smi_pids(rows)
    for wid in (a, b):
        mine = set(pids.get(wid, []))
        check(
            f"shares.{wid}.nvml_sees_pid",
            bool(mine & nvml_pids),
            f"workload pids {sorted(mine)}; NVML pids {sorted(nvml_pids)} (a PID-namespace mismatch shows here)",
        )
        check(f"shares.{wid}.nvidia_smi_lists", bool(mine & listed), f"nvidia-smi pids {sorted(listed)}")
    check(
        "shares.two_processes_on_gpu",
        len(listed) >= 2 or len(nvml_pids) >= 2,
        f"nvidia-smi lists {len(rows)} compute app(s), NVML {len(procs)}",
    )


def step_watchdog() -> None:
    a, b = state()["share_ids"]
    # 1.0 x its allowance + 2 GiB: over the share plus the watchdog's 512 MiB slack for the CUDA context
    hog = submit("hog", "0.25", "1.0", "2048", "120")
    save(hog_id=hog)
    t0 = time.time()
    ended = wait(lambda: workload(hog)["state"] in TERMINAL, 8 if SIM else 50, 1.0)
    w = workload(hog)
    log(f"hog {hog}: {w['state']} exit={w['exit_code']} reason={w['reason']!r} after {time.time() - t0:.1f}s")
    print(wlog(hog)[-2000:], flush=True)
    events = api("GET", f"/v1/workloads/{hog}/events").json()
    log("hog events:", json.dumps(events)[:2000])
    if SIM:
        record("watchdog.stopped", "skip", f"simulated pool: no watchdog (hog state {w['state']})")
    elif state().get("mps_daemon"):  # MPS caps the hog's device memory before the watchdog sees it over
        oom = "out of memory" in wlog(hog).lower()
        check(
            "mps.memory_limit_stops_hog",
            ended and w["state"] == "failed" and (oom or str(w["reason"] or "").startswith("watchdog:")),
            f"state {w['state']}, reason {w['reason']!r}, CUDA out of memory in its log: {oom}, "
            f"{time.time() - t0:.0f}s after submit",
        )
    else:
        check(
            "watchdog.stopped",
            ended and w["state"] == "failed" and str(w["reason"] or "").startswith("watchdog:"),
            f"state {w['state']}, reason {w['reason']!r}, {time.time() - t0:.0f}s after submit",
        )
        if not ended:
            log("workload pids:", workload_pids(), "NVML processes:", nvml_processes())
    sa, sb = workload(a)["state"], workload(b)["state"]
    check("watchdog.neighbours_running", sa == sb == "running", f"share-a {sa}, share-b {sb}")


def _metric(lines: list[str], name: str) -> float | None:
    for ln in lines:
        if ln.startswith((name + "{", name + " ")):
            return float(ln.rsplit(" ", 1)[1])
    return None


def step_metrics() -> None:
    text = api("GET", "/metrics").text
    (WORK / "metrics.txt").write_text(text)
    dcgm = [ln for ln in text.splitlines() if ln.startswith("DCGM_FI_")]
    proc = [ln for ln in text.splitlines() if "process" in ln and not ln.startswith("#")]
    for ln in dcgm + proc[:20]:
        print("  |", ln, flush=True)
    if SIM:
        check("metrics.none_when_simulated", not dcgm, f"{len(dcgm)} DCGM lines on a simulated pool")
        return
    used, free = _metric(dcgm, "DCGM_FI_DEV_FB_USED"), _metric(dcgm, "DCGM_FI_DEV_FB_FREE")
    util, power = _metric(dcgm, "DCGM_FI_DEV_GPU_UTIL"), _metric(dcgm, "DCGM_FI_DEV_POWER_USAGE")
    rows = smi("--query-gpu=memory.used,memory.free,utilization.gpu,power.draw,memory.total")
    smi_used = float(rows[0][0]) if rows else None
    smi_total = float(rows[0][4]) if rows else None
    present = None not in (used, free, util, power)
    check("metrics.dcgm_present", present, f"used={used} free={free} util={util} power={power}")
    if used is not None and smi_used is not None:
        check(
            "metrics.fb_used_matches_smi",
            abs(used - smi_used) <= max(2048, 0.1 * smi_used),
            f"DCGM_FI_DEV_FB_USED {used} MiB vs nvidia-smi memory.used {smi_used} MiB (sampled seconds apart)",
        )
        reserved = smi("--query-gpu=memory.reserved")  # its own query: older nvidia-smi lacks the field
        record(
            "facts.fb_used_vs_smi",
            "info",
            f"DCGM_FI_DEV_FB_USED - nvidia-smi memory.used = {used - smi_used:+.0f} MiB; "
            f"nvidia-smi memory.reserved = {reserved[0][0] if reserved else '?'} MiB (NVML v1 used includes it)",
        )
    if used is not None and free is not None and smi_total is not None:
        check(
            "metrics.fb_total_matches_smi",
            abs(used + free - smi_total) <= max(1024, 0.02 * smi_total),
            f"used+free = {used + free} MiB, nvidia-smi memory.total {smi_total} MiB",
        )
    if power is not None:
        check("metrics.power_plausible", 5 <= power <= 1500, f"{power} W (smi {rows[0][3] if rows else '?'})")
    check("metrics.process_series", bool(proc), f"{len(proc)} process series lines")


def step_cancel_shares() -> None:
    ids: list[int] = state().get("share_ids", [])
    for wid in ids:
        cli("cancel", str(wid))
    ok = wait(lambda: all(workload(w)["state"] in TERMINAL for w in ids), 30, 1.0)
    check("cancel.shares", ok, f"{[(w, workload(w)['state']) for w in ids]}")
    if not SIM:
        time.sleep(1)
        rows = smi("--query-compute-apps=pid,used_memory,gpu_uuid")
        left = set(workload_pids()) & set(ids)
        check("cancel.gone_from_gpu", not left, f"processes left {left}; nvidia-smi apps now {rows}")
