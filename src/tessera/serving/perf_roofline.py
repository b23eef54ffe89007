"""The embedded default performance model: a roofline from GPU datasheet figures and the model's shape, with no
measured numbers, so that the twin runs where the calibration data (``../shared``) is absent.

Per iteration, on each of the replica's ``tensor_parallel`` GPUs:

- fixed cost: ``iteration_overhead_s`` (scheduling, sampling, launch of the step) + per layer ``layer_overhead_s``
  (kernel launches and small kernels) + per layer two tensor-parallel all-reduces of ``collective_latency_s`` each
  when TP > 1;
- decode step of B sequences: fixed cost + max(weight read at ``hbm_efficiency`` of the peak bandwidth, B tokens'
  FLOPs at ``compute_efficiency`` of the peak) + ``per_seq_s`` x B, then per context token its KV bytes at the
  bandwidth (affine in the KV tokens for a fixed B);
- prefill of x tokens: fixed cost + max(weight read, x tokens' FLOPs) + the all-reduces' bytes (two per layer of
  x x hidden activations, ring: 2 (TP - 1) / TP of them cross the peer link).

Mixed iterations follow ``perf_fit.IterationRule``. Attention's quadratic FLOPs in long prompts are left out (under
10% of a 7B model's prefill FLOPs below 4k tokens).

Default factors and why: ``hbm_efficiency`` 0.85 (decode GEMVs reach 80-90% of peak bandwidth); compute 0.6 (the
MFU of large prefill GEMMs in serving engines); fixed costs sized so that a 7B model on one H100 decodes at batch 1 in
about 8 ms and a 70B model on four H100s in about 20 ms, as public vLLM figures show.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tessera.serving.gpus import GpuSpec
from tessera.serving.models import ModelSpec
from tessera.serving.perf_fit import IterationRule
from tessera.serving.perf_scaling import HBM_EFFICIENCY, ReplicaShape


@dataclass(frozen=True, slots=True)
class RooflineFactors:
    hbm_efficiency: float = HBM_EFFICIENCY
    compute_efficiency: float = 0.6
    iteration_overhead_s: float = 0.002
    layer_overhead_s: float = 40e-6
    collective_latency_s: float = 15e-6
    per_seq_s: float = 20e-6

    def __post_init__(self) -> None:
        for name in ("hbm_efficiency", "compute_efficiency"):
            if not 0 < getattr(self, name) <= 1:
                raise ValueError(f"roofline: {name} must be in (0, 1], got {getattr(self, name)}")
        for name in ("iteration_overhead_s", "layer_overhead_s", "collective_latency_s", "per_seq_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"roofline: {name} must be >= 0, got {getattr(self, name)}")


@dataclass(frozen=True, slots=True)
class RooflinePerf(IterationRule):
    """Iteration times of ``spec`` on ``tensor_parallel`` GPUs of type ``gpu`` from first principles."""

    spec: ModelSpec
    gpu: GpuSpec
    tensor_parallel: int
    factors: RooflineFactors = RooflineFactors()
    # Derived once (the engine asks for iteration times in its inner loop).
    fixed_s: float = field(init=False, compare=False)
    weights_s: float = field(init=False, compare=False)
    token_s: float = field(init=False, compare=False)  # one token's FLOPs at the compute efficiency
    allreduce_token_s: float = field(init=False, compare=False)  # one prefill token's all-reduce traffic
    kv_s: float = field(init=False, compare=False)

    def __post_init__(self) -> None:
        shape = ReplicaShape(self.spec, self.gpu, self.tensor_parallel)  # validates tensor_parallel
        f, tp = self.factors, self.tensor_parallel
        collectives = 2 * f.collective_latency_s if tp > 1 else 0.0
        ring = 2 * (tp - 1) / tp / (self.gpu.peer_gb_s * 1e9)
        derived = {
            "fixed_s": f.iteration_overhead_s + self.spec.layers * (f.layer_overhead_s + collectives),
            "weights_s": shape.weights_read_s(f.hbm_efficiency),
            "token_s": shape.token_compute_s() / f.compute_efficiency,
            "allreduce_token_s": 2 * self.spec.layers * self.spec.hidden * self.spec.dtype_bytes * ring,
            "kv_s": shape.kv_read_s_per_token(f.hbm_efficiency),
        }
        for name, value in derived.items():
            object.__setattr__(self, name, value)

    def prefill_s(self, tokens: int) -> float:
        return self.fixed_s + max(self.weights_s, tokens * self.token_s) + tokens * self.allreduce_token_s

    def decode_intercept_s(self, batch: int) -> float:
        return self.fixed_s + max(self.weights_s, batch * self.token_s) + self.factors.per_seq_s * batch

    def kv_token_s(self) -> float:
        return self.kv_s
