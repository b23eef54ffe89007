"""Two LLM-like decode loops on one GPU: how much they slow each other, measured against the twin's model.

    python3 scripts/gpu_check/interference.py --out $OUT/interference.json       # on the GPU machine (needs torch)
    python3 scripts/gpu_check/interference.py --device cpu --tiny --out /tmp/i.json  # the logic, on a CPU

The twin (`tessera.sim.serving.interference`) says: under time-slicing k busy replicas each run k-fold slower;
under MPS a busy replica's step stretches to the busy replicas' saturating times added up (each ``u`` x its step
alone), where a replica's intensity ``u`` counts as free for neighbours only what a one-sequence step spends beyond
streaming its weights at 85% of the datasheet bandwidth. (Until this script's first run, on an H100, the twin's MPS
rule was ``max(1, sum of the busy replicas' intensities)``: the right total, not the right split between a busy and
a light replica; both are printed.) This script measures both sharing modes on the GPU it runs on, with a synthetic
decoder that does what an engine's decode step does (per layer: the QKV, output and gated-MLP products of a
batch of single tokens, attention over a KV cache of ``--context`` tokens per sequence; then the LM head; the step
replayed as a CUDA graph and synchronised, as engines do before sampling):

1. alone: the step at batch 1 and at ``--batch``, for the intensity the twin would assign;
2. two busy loops at once under time-slicing (no MPS daemon), and a busy loop beside a batch-4 one;
3. the same under MPS, when ``nvidia-cuda-mps-control`` is there: this script starts a daemon with its own pipe
   and log folders in /tmp and quits it at the end (it changes no GPU setting).

Each run starts its processes together (they wait for a go file once warmed up) and counts steps for
``--seconds``. It prints a table and writes JSON: the measured slowdowns beside the twin's predictions.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, NoReturn

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))  # the twin's rules (standard library only)

from tessera.core.errors import TesseraError  # noqa: E402
from tessera.gpu.nvml import match_catalog_model  # noqa: E402
from tessera.serving.gpus import gpu_spec  # noqa: E402
from tessera.sim.serving.interference import intensity_of_steps, slowdown, weights_stream_s  # noqa: E402

# -- the worker: one process, one decode loop -------------------------------------------------------------------


def worker(args: argparse.Namespace) -> int:
    torch: Any = importlib.import_module("torch")
    F: Any = importlib.import_module("torch.nn.functional")
    dev = torch.device(args.device)
    if args.device == "cpu":
        torch.set_num_threads(1)  # two loops' thread pools would otherwise spin against each other
    dtype = torch.float16 if args.device == "cuda" else torch.float32
    h, ffn, heads, layers, batch, ctx = args.hidden, args.ffn, args.heads, args.layers, args.batch, args.context
    d = h // heads
    gen = torch.Generator(device=dev).manual_seed(batch)

    def rand(*shape: int) -> Any:
        return torch.randn(*shape, device=dev, dtype=dtype, generator=gen) * 0.02

    if args.matmul:
        return matmul_loop(args, torch, rand)
    weights = [(rand(h, 3 * h), rand(h, h), rand(h, 2 * ffn), rand(ffn, h)) for _ in range(layers)]
    lm_head = rand(h, args.vocab)
    kv = [(rand(batch, heads, ctx, d), rand(batch, heads, ctx, d)) for _ in range(layers)]
    x0 = rand(batch, h)
    weight_bytes = sum(t.numel() * t.element_size() for w in weights for t in w) + lm_head.numel() * 2
    kv_bytes = sum(t.numel() * t.element_size() for pair in kv for t in pair)

    def step() -> Any:
        x = x0
        for (wqkv, wo, wup, wdown), (k, v) in zip(weights, kv, strict=True):
            q = (x @ wqkv)[:, :h].view(batch, heads, 1, d)
            a = F.scaled_dot_product_attention(q, k, v).reshape(batch, h)
            x = x + a @ wo
            gate, up = (x @ wup).chunk(2, dim=-1)
            x = x + (F.silu(gate) * up) @ wdown
        return (x @ lm_head).argmax(dim=-1)

    run = step
    if args.device == "cuda":
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = step()

        def run() -> Any:
            graph.replay()
            return out

    def sync() -> None:
        if args.device == "cuda":
            torch.cuda.synchronize()

    times = timed_loop(args, lambda: run().cpu(), sync)  # the engine reads the sampled tokens back every step
    result = {"batch": batch, "weight_bytes": weight_bytes, "kv_bytes": kv_bytes}
    Path(args.result).write_text(json.dumps(result | step_stats(times)))
    return 0


def timed_loop(args: argparse.Namespace, run: Any, sync: Any) -> list[float]:
    """Warm up, say ready, wait for the go file's start time, then time steps until ``--seconds`` have passed."""
    for _ in range(5):
        run()
        sync()
    Path(args.ready).write_text("ready")
    go = Path(args.go)
    while not go.exists():
        time.sleep(0.005)
    start_at = float(go.read_text())
    while time.time() < start_at:
        time.sleep(0.001)
    times: list[float] = []
    end = start_at + args.seconds
    while time.time() < end:
        t0 = time.perf_counter()
        run()
        sync()
        times.append(time.perf_counter() - t0)
    return times


def step_stats(times: list[float]) -> dict[str, Any]:
    return {
        "steps": len(times),
        "step_ms_median": statistics.median(times) * 1e3,
        "step_ms_mean": statistics.fmean(times) * 1e3,
    }


def matmul_loop(args: argparse.Namespace, torch: Any, rand: Any) -> int:
    """A compute-bound loop (square matrix products) for MPS's thread cap: reports TFLOP/s."""
    n = args.matmul
    a, b = rand(n, n), rand(n, n)
    if args.device == "cuda":
        a, b = a.to(torch.bfloat16), b.to(torch.bfloat16)
    times = timed_loop(args, lambda: a @ b, torch.cuda.synchronize if args.device == "cuda" else lambda: None)
    stats = step_stats(times)
    tflops = 2 * n**3 / (stats["step_ms_median"] / 1e3) / 1e12
    cap = os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "")
    Path(args.result).write_text(json.dumps({"batch": 0, "matmul": n, "thread_pct": cap, "tflops": tflops} | stats))
    return 0


# -- the orchestrator ---------------------------------------------------------------------------------------------


def run_together(
    args: argparse.Namespace,
    batches: list[int],
    env: dict[str, str],
    tag: str,
    envs: list[dict[str, str]] | None = None,
    matmul: int = 0,
) -> list[dict[str, Any]]:
    """Start one worker per batch size (each with ``env`` and its own ``envs[i]``), wait until all are warm, let
    them loop together, return their results."""
    work = Path(tempfile.mkdtemp(prefix=f"interf-{tag}-"))
    go = work / "go"
    procs = []
    for i, b in enumerate(batches):
        cmd = [
            sys.executable,
            __file__,
            "--worker",
            "--batch",
            str(b),
            "--ready",
            str(work / f"ready{i}"),
            "--go",
            str(go),
            "--result",
            str(work / f"result{i}.json"),
        ]
        cmd += [
            f"--{k}={getattr(args, k)}"
            for k in ("device", "hidden", "ffn", "heads", "layers", "context", "vocab", "seconds")
        ]
        cmd += [f"--matmul={matmul}"]
        procs.append(subprocess.Popen(cmd, env=env | (envs[i] if envs else {})))
    deadline = time.time() + args.warmup_timeout
    while not all((work / f"ready{i}").exists() for i in range(len(batches))):
        if time.time() > deadline or any(p.poll() not in (None, 0) for p in procs):
            for p in procs:
                p.kill()
            raise RuntimeError(f"{tag}: workers did not get ready (exit codes {[p.poll() for p in procs]})")
        time.sleep(0.05)
    go.write_text(str(time.time() + 0.5))
    for p in procs:
        p.wait(timeout=args.seconds + 60)
    results = [json.loads((work / f"result{i}.json").read_text()) for i in range(len(batches))]
    shutil.rmtree(work, ignore_errors=True)
    for r in results:
        if r.get("matmul"):
            print(f"  {tag:<22} matmul, {r['thread_pct'] or 100}% threads: {r['tflops']:7.1f} TFLOP/s", flush=True)
            continue
        print(f"  {tag:<22} batch {r['batch']:>4}: {r['step_ms_median']:8.3f} ms/step ({r['steps']} steps)", flush=True)
    return results


def parse_shapes(text: str) -> list[tuple[int, int, int]]:
    """``--mps-shapes``: ``BATCH,SMALL_BATCH,CONTEXT`` triples of positive integers, separated by ``;``."""
    shapes = []
    for item in filter(None, text.split(";")):
        parts = item.split(",")
        if len(parts) != 3 or not all(x.strip().isdigit() and int(x) > 0 for x in parts):
            fail(f"--mps-shapes: {item!r} is not BATCH,SMALL_BATCH,CONTEXT (three positive integers)")
        big, small, ctx = (int(x) for x in parts)
        shapes.append((big, small, ctx))
    return shapes


def fail(message: str) -> NoReturn:
    """One line on stderr, exit status 2."""
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def gpu_name_and_bandwidth(args: argparse.Namespace) -> tuple[str, float]:
    try:
        torch: Any = importlib.import_module("torch")
    except ImportError:
        fail(f"{sys.executable} has no torch; run it with a Python that has")
    if args.device != "cuda":
        return "cpu", args.hbm_gb_s or 50.0
    if not torch.cuda.is_available():
        fail("torch sees no CUDA GPU here; --device cpu --tiny checks the script without one")
    name = torch.cuda.get_device_name(0)
    if args.hbm_gb_s:
        return name, args.hbm_gb_s
    mem_mib = torch.cuda.get_device_properties(0).total_memory >> 20
    try:  # the GPU as Tessera's discovery names it, and the serving catalog's datasheet figure
        return name, gpu_spec(match_catalog_model(name, mem_mib)).hbm_gb_s
    except TesseraError as exc:
        fail(f"no datasheet bandwidth for {name!r} ({exc}); pass --hbm-gb-s")


class MpsDaemon:
    """An MPS control daemon with its own pipe and log folders, quit on exit."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="tessera-mps-"))
        self.env = dict(
            os.environ, CUDA_MPS_PIPE_DIRECTORY=str(self.root / "pipe"), CUDA_MPS_LOG_DIRECTORY=str(self.root / "log")
        )
        (self.root / "pipe").mkdir()
        (self.root / "log").mkdir()

    def __enter__(self) -> MpsDaemon:
        subprocess.run(["nvidia-cuda-mps-control", "-d"], env=self.env, check=True, timeout=30)
        time.sleep(1.0)
        return self

    def __exit__(self, *exc: object) -> None:
        subprocess.run(["nvidia-cuda-mps-control"], input="quit\n", text=True, env=self.env, timeout=30)
        time.sleep(1.0)
        log = self.root / "log" / "control.log"
        if log.exists():
            print("  mps control.log (tail):", *log.read_text().splitlines()[-5:], sep="\n    ")


def scenario_set(args: argparse.Namespace, env: dict[str, str], mode: str, hbm: float) -> dict[str, Any]:
    big, small = args.batch, args.small_batch
    one = run_together(args, [1], env, f"{mode} alone b1")[0]
    alone = run_together(args, [big], env, f"{mode} alone b{big}")[0]
    alone_small = run_together(args, [small], env, f"{mode} alone b{small}")[0]
    pair = run_together(args, [big, big], env, f"{mode} pair b{big}+b{big}")
    mixed = run_together(args, [big, small], env, f"{mode} pair b{big}+b{small}")
    s1, sb, ss = one["step_ms_median"], alone["step_ms_median"], alone_small["step_ms_median"]
    weights_s = weights_stream_s(alone["weight_bytes"], hbm)
    u_big = intensity_of_steps(sb / 1e3, s1 / 1e3, weights_s)
    u_small = intensity_of_steps(ss / 1e3, s1 / 1e3, weights_s)

    def twin(steps: list[float], us: list[float]) -> list[float]:
        """The twin's slowdown of each loop when all are busy (``tessera.sim.serving.interference.slowdown``)."""
        saturating = sum(u * s for u, s in zip(us, steps, strict=True))
        return [round(slowdown(mode, len(steps), saturating, s), 3) for s in steps]

    def summed_intensities(us: list[float]) -> float:  # the twin's MPS rule before this measurement
        return float(len(us)) if mode == "time-slice" else round(max(1.0, sum(us)), 3)

    return {
        "alone_step_ms": {"1": s1, str(big): sb, str(small): ss},
        "intensity_twin_formula": {str(big): round(u_big, 3), str(small): round(u_small, 3)},
        "pair_same": {
            "measured_slowdown": [round(r["step_ms_median"] / sb, 3) for r in pair],
            "twin_predicts": twin([sb, sb], [u_big, u_big]),
            "summed_intensity_rule": summed_intensities([u_big, u_big]),
            "throughput_vs_one_alone": round(sum(sb / r["step_ms_median"] for r in pair), 3),
        },
        "pair_mixed": {
            "measured_slowdown": {
                str(big): round(mixed[0]["step_ms_median"] / sb, 3),
                str(small): round(mixed[1]["step_ms_median"] / ss, 3),
            },
            "twin_predicts": dict(zip((str(big), str(small)), twin([sb, ss], [u_big, u_small]), strict=True)),
            "summed_intensity_rule": summed_intensities([u_big, u_small]),
        },
        "weight_gib": round(alone["weight_bytes"] / 2**30, 2),
        "kv_gib_at_big_batch": round(alone["kv_bytes"] / 2**30, 2),
    }


def thread_caps(args: argparse.Namespace, env: dict[str, str]) -> dict[str, Any]:
    """What ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` (Tessera's compute share under MPS) does to a compute-bound loop:
    alone at 100% and 25%, then a 25% and a 75% loop at once."""

    def cap(pct: int) -> dict[str, str]:
        return {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(pct)}

    n = args.matmul_n
    full = run_together(args, [0], env, "mps matmul 100%", [cap(100)], matmul=n)[0]["tflops"]
    quarter = run_together(args, [0], env, "mps matmul 25%", [cap(25)], matmul=n)[0]["tflops"]
    pair = run_together(args, [0, 0], env, "mps matmul 25%+75%", [cap(25), cap(75)], matmul=n)
    return {
        "matmul_n": n,
        "tflops_alone": {"100": round(full, 1), "25": round(quarter, 1)},
        "tflops_together": {"25": round(pair[0]["tflops"], 1), "75": round(pair[1]["tflops"], 1)},
        "share_of_full": {
            "25 alone": round(quarter / full, 3),
            "25 together": round(pair[0]["tflops"] / full, 3),
            "75 together": round(pair[1]["tflops"] / full, 3),
        },
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--ready"), p.add_argument("--go"), p.add_argument("--result")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--tiny", action="store_true", help="a tiny decoder (for checking the script on a CPU)")
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--ffn", type=int, default=11008)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--layers", type=int, default=16, help="16 of a 7B's 32 layers: 6.5 GiB of weights")
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--context", type=int, default=1024, help="KV-cache tokens per sequence")
    p.add_argument("--batch", type=int, default=48, help="the busy loop's batch")
    p.add_argument("--small-batch", type=int, default=4)
    p.add_argument("--matmul", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--matmul-n", type=int, default=8192, help="the compute-bound loop's matrix size (MPS caps)")
    p.add_argument(
        "--mps-shapes",
        default="128,16,512",
        help="more decode shapes to measure under MPS: BATCH,SMALL_BATCH,CONTEXT;... ('' for none)",
    )
    p.add_argument("--seconds", type=float, default=4.0)
    p.add_argument("--warmup-timeout", type=float, default=120.0)
    p.add_argument("--hbm-gb-s", type=float, default=0.0, help="datasheet HBM bandwidth (default: by GPU name)")
    p.add_argument("--out", type=Path, default=Path("interference.json"))
    args = p.parse_args(argv)
    shapes = parse_shapes(args.mps_shapes)
    if args.tiny:
        args.hidden, args.ffn, args.heads, args.layers, args.vocab, args.context = 256, 512, 4, 2, 1000, 64
        args.batch, args.seconds = min(args.batch, 8), min(args.seconds, 1.0)
    if args.worker:
        return worker(args)
    name, hbm = gpu_name_and_bandwidth(args)
    print(
        f"GPU: {name}; datasheet HBM {hbm:.0f} GB/s; decoder: {args.layers} layers, hidden {args.hidden}, "
        f"context {args.context}, busy batch {args.batch}, small batch {args.small_batch}",
        flush=True,
    )
    summary: dict[str, Any] = {
        "gpu": name,
        "hbm_gb_s_datasheet": hbm,
        "config": {
            k: getattr(args, k)
            for k in ("hidden", "ffn", "heads", "layers", "vocab", "context", "batch", "small_batch", "seconds")
        },
    }
    summary["time-slice"] = scenario_set(args, dict(os.environ), "time-slice", hbm)
    if args.device == "cuda" and shutil.which("nvidia-cuda-mps-control"):
        try:
            with MpsDaemon() as mps:
                summary["mps"] = scenario_set(args, mps.env, "mps", hbm)
                for big, small, ctx in shapes:
                    other = argparse.Namespace(**(vars(args) | {"batch": big, "small_batch": small, "context": ctx}))
                    summary[f"mps b{big} b{small} ctx{ctx}"] = scenario_set(other, mps.env, "mps", hbm)
                summary["mps thread caps"] = thread_caps(args, mps.env)
        except (subprocess.SubprocessError, RuntimeError, OSError) as exc:
            summary["mps"] = {"error": f"{type(exc).__name__}: {exc}"}
    else:
        summary["mps"] = {"error": "nvidia-cuda-mps-control not found" if args.device == "cuda" else "not a GPU"}
    args.out.write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
