"""A clairvoyant lower bound on the GPU-hours of a serving study row, under the twin's own physics.

    .venv/bin/python bench/serving_bound.py --trace ../shared/traces/azure-llm/AzureLLMInferenceTrace_conv.csv \
        --models 8 --zipf 0.9 --load 5 --seeds 0,1,2 --static

For each seed's workload (the same split into N models as ``tessera simulate serving``), per bin of the trace (a
minute by default) and per model, the least GPU capacity that serves the requests arriving in that bin:

- **compute**: every output token at the model's best decode efficiency (``tp x step / B`` at the batch ``B`` that
  minimises it, with the step within the interactive TPOT target, ``B`` within the engine's ``max_running`` and
  the KV cache a whole-GPU replica of the model has, at the model's output-weighted mean KV footprint per
  sequence), and every prompt token at the best prefill cost per token (chunks of 256 to 2,048 tokens), from the
  same performance model the twin's engines run on;
- **memory**: the weights of every model (none can scale to zero at this load: each has arrivals every minute),
  plus the KV cache its sequences hold if they decode at the batch-1 step (the fastest), in GPUs of 80 GiB.

Three figures per seed, in GPU-hours over the trace:

- ``fractional``: per bin, ``max(sum of compute x MPS intensity, sum of memory)`` with GPUs divisible at will,
  every model at its best efficiency all the time, no headroom for bursts inside a bin, no TTFT queueing, and the
  MPS credit of the twin's interference model (a replica of intensity ``u`` leaves ``1 - u`` of a GPU to others);
- ``fractional, no MPS credit``: the same with compute counted in whole GPU-seconds;
- ``whole-GPU``: per bin and model, whole replicas of ``tp`` GPUs (``tp x max(1, ceil(compute / tp))``): what a
  clairvoyant autoscaler that gives each model, every bin, the whole replicas its mean demand in that bin needs
  would hold. Not a lower bound: a fixed replica count serves a bin whose mean demand exceeds it by queueing into
  the next bins and by the 1% of requests allowed to miss (with one-minute bins ``static`` stays below it).

The fractional figures are lower bounds whatever the bin: every token costs at least the best cost per token, and
GPUs are divisible, so work moved between bins leaves the compute total as it is (``--bin-s 3600``, one bin for
the whole trace, gives them within 1% of the one-minute bins). Their approximation is the KV footprint: the best
batch is read at the model's mean footprint per sequence, not over the mix of short and long sequences.

With ``--static`` it also sizes the ``static`` baseline as the study does (each model alone, the fewest replicas
that meet its SLOs; about half a minute per seed at N = 8) and prints 60% of its GPU-hours: what tessera must reach
for the issue's 40% saving. The bound is optimistic on purpose (it ignores queueing for the 2 s TTFT target,
interference beyond the MPS credit, placement and start-up delays), so a target below it cannot be met by any
policy on the twin, and a target just above it can be met only by a policy within a few percent of perfect.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from tessera.serving.models import GIB, ModelSpec
from tessera.serving.policies.engine_parts import EngineConfig, IterationTimes
from tessera.serving.policies.requests import DEFAULT_SLO_TARGETS, SloClass
from tessera.serving.setups import ReplicaSizing
from tessera.serving.sizing import BLOCK_TOKENS, replica_shape
from tessera.sim.placement_study.sweep import parse_seeds
from tessera.sim.serving.config import StudyConfig
from tessera.sim.serving.interference import intensity
from tessera.sim.serving.perf_choice import make_perf_factory
from tessera.sim.serving.study import run_study
from tessera.sim.serving.trace import read_llm_trace
from tessera.sim.serving.workload import Workload, build_workload

FloatArray = npt.NDArray[np.float64]
GPU = "H100-80GB"
GPU_BYTES = 80 * GIB
PREFILL_CHUNKS = (256, 512, 1024, 2048)


@dataclass(frozen=True, slots=True)
class ModelCosts:
    decode_gpu_s_per_token: float  # at the best batch
    prefill_gpu_s_per_token: float
    best_batch: int
    step_s: float  # the decode step at the best batch
    mps_intensity: float
    batch1_step_s: float


def model_costs(spec: ModelSpec, perf: IterationTimes, footprint: float) -> ModelCosts:
    tp = spec.tensor_parallel
    tpot = DEFAULT_SLO_TARGETS[SloClass.INTERACTIVE].tpot_s
    kv_tokens = replica_shape(spec, GPU, ReplicaSizing(shared=False)).kv_blocks * BLOCK_TOKENS
    best: tuple[float, int, float] | None = None
    for batch in range(1, EngineConfig(kv_blocks=1).max_running + 1):
        kv = int(batch * footprint)
        if kv > kv_tokens:
            break
        step = perf.iteration_s(0, batch, kv)
        if step > tpot:
            break
        cost = tp * step / batch
        if best is None or cost < best[0]:
            best = (cost, batch, step)
    assert best is not None, f"{spec.name}: not even one sequence fits"
    prefill = min(perf.iteration_s(n, 0, 0) / n for n in PREFILL_CHUNKS) * tp
    u = intensity(spec, GPU, tp, perf, best[1], int(best[1] * footprint))
    return ModelCosts(best[0], prefill, best[1], best[2], u, perf.iteration_s(0, 1, int(footprint)))


@dataclass(frozen=True, slots=True)
class Bound:
    fractional: float  # GPU-hours
    fractional_no_mps: float
    whole_gpu: float
    compute_gpus_mean: float
    memory_gpus_mean: float
    per_model_compute_mean: dict[str, float]


def bound(workload: Workload, bin_s: float) -> Bound:
    perf = make_perf_factory()
    bins = max(1, math.ceil(workload.duration_s / bin_s))
    names = [m.name for m in workload.models]
    index = {name: i for i, name in enumerate(names)}
    specs = [m.spec for m in workload.models]
    out = np.zeros(len(names))
    weighted = np.zeros(len(names))
    for r in workload.requests:
        i = index[r.model]
        out[i] += r.output_tokens
        weighted[i] += r.output_tokens * (r.prompt_tokens + r.output_tokens / 2)
    costs = [
        model_costs(spec, perf(spec, GPU, spec.tensor_parallel), weighted[i] / max(out[i], 1.0))
        for i, spec in enumerate(specs)
    ]
    # each bin's width: the last one ends with the trace, so that GPU-hours count the trace's duration, as the twin's do
    width = np.minimum(bin_s, workload.duration_s - bin_s * np.arange(bins))
    width = np.maximum(width, 1e-9)
    compute = np.zeros((len(names), bins))  # GPUs, averaged over the bin
    kv_bytes = np.zeros((len(names), bins))
    for r in workload.requests:
        i, k = index[r.model], min(bins - 1, int(r.arrival_s // bin_s))
        c = costs[i]
        gpu_s = r.output_tokens * c.decode_gpu_s_per_token + r.prompt_tokens * c.prefill_gpu_s_per_token
        compute[i, k] += gpu_s / width[k]
        held_s = r.output_tokens * c.batch1_step_s
        kv_bytes[i, k] += (r.prompt_tokens + r.output_tokens / 2) * specs[i].kv_bytes_per_token * held_s / width[k]
    weights = np.array([s.weights_bytes for s in specs], dtype=np.float64)[:, None]
    memory = ((weights + kv_bytes) / GPU_BYTES).sum(axis=0)
    u = np.array([c.mps_intensity for c in costs])[:, None]
    tp = np.array([s.tensor_parallel for s in specs], dtype=np.float64)[:, None]
    whole = (tp * np.maximum(1.0, np.ceil(compute / tp - 1e-9))).sum(axis=0)
    hours = width / 3600.0
    share = width / width.sum()  # for time-weighted means
    return Bound(
        fractional=float(np.maximum((compute * u).sum(axis=0), memory) @ hours),
        fractional_no_mps=float(np.maximum(compute.sum(axis=0), memory) @ hours),
        whole_gpu=float(whole @ hours),
        compute_gpus_mean=float(compute.sum(axis=0) @ share),
        memory_gpus_mean=float(memory @ share),
        per_model_compute_mean={n: round(float(compute[i] @ share), 2) for i, n in enumerate(names)},
    )


def static_gpu_hours(args: argparse.Namespace, seed: int) -> float:
    """The ``static`` baseline's GPU-hours for one seed, sized by the study itself (``tessera simulate serving``)."""
    config = StudyConfig(
        trace=args.trace, models=args.models, zipf=args.zipf, load=args.load, policies=("static",), seeds=(seed,)
    )
    return run_study(config)[0].gpu_hours


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", type=Path, required=True)
    parser.add_argument("--models", type=int, default=8)
    parser.add_argument("--zipf", type=float, default=0.9)
    parser.add_argument("--load", type=float, default=5.0)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--bin-s", type=float, default=60.0)
    parser.add_argument("--static", action="store_true", help="also size static and print 60%% of its GPU-hours")
    args = parser.parse_args(argv)
    if not args.trace.is_file():
        print(f"error: {args.trace}: no such file", file=sys.stderr)
        return 2
    trace = read_llm_trace(args.trace)
    for seed in parse_seeds(args.seeds):
        workload = build_workload(trace, args.models, args.zipf, args.load, seed)
        b = bound(workload, args.bin_s)
        row: dict[str, object] = {
            "models": args.models,
            "zipf": args.zipf,
            "load": args.load,
            "seed": seed,
            "bin_s": args.bin_s,
            "bound_fractional_gpu_h": round(b.fractional, 2),
            "bound_fractional_no_mps_gpu_h": round(b.fractional_no_mps, 2),
            "bound_whole_gpu_gpu_h": round(b.whole_gpu, 2),
            "compute_gpus_mean": round(b.compute_gpus_mean, 2),
            "memory_gpus_mean": round(b.memory_gpus_mean, 2),
            "compute_gpus_mean_per_model": b.per_model_compute_mean,
        }
        if args.static:
            static = static_gpu_hours(args, seed)
            row["static_gpu_h"] = round(static, 2)
            row["target_60pct_of_static_gpu_h"] = round(0.6 * static, 2)
            row["bound_over_target"] = round(b.fractional / (0.6 * static), 3)
        print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
