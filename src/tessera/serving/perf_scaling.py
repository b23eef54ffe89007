"""Scaling a calibrated performance model to another model, GPU or tensor-parallel degree.

The measured grid covers llama2-70b (and bloom-176b) on A100/H100 at TP 2-8; a fleet serves 7B-70B models on one
or a few GPUs. Each term of the calibrated iteration is scaled by what it physically depends on:

- Decode intercept (a step of ~0 sequences) = engine overhead + one read of the weights. The weight read is the
  source's weights per GPU at ``hbm_efficiency`` of the peak bandwidth (capped at the intercept) and scales by
  (weight bytes per GPU / bandwidth). The rest is the engine's overhead: a part per layer (kernel launches, small
  kernels, scheduling), scaled by the number of layers and not by bytes, so that a 7B model on one GPU is not ten
  times faster per step than the measured engine allows; and the tensor-parallel collectives' latency, per layer
  and per rank beyond the first (``Collectives``).
- Per-sequence terms (what a step gains per decoding sequence): part engine bookkeeping that no model size
  changes, part per-token work per GPU; ``per_seq_fixed_fraction`` (default one half) is the first part. Across the
  H100 rows (llama2-70b at TP4 and TP8, bloom-176b at TP8), about half of the growth at batch 64 does not follow the
  per-GPU work.
- Per-KV-token term: its bandwidth-bound part (the KV bytes per token per GPU at ``hbm_efficiency`` of the
  bandwidth, the floor the fit keeps) scales by bytes; what the fit found above that floor is the engine's
  inefficiency per context token and scales with the layers. KV heads split across tensor-parallel ranks until
  there are fewer heads than ranks (then they are replicated).
- Prefill: ``intercept + (prefill(x) - intercept)``: the token work above the decode intercept scales by FLOPs
  per token per GPU over peak FLOPs, and its all-reduce share (``Collectives``) by all-reduce bytes over the peer
  bandwidth; the intercept as above.

What this assumes: the same engine software as the source (same kernels, same overheads per layer); compute-bound
prefill and memory-bound decode, each at the source's efficiency. ``perf_model.calibrated_perf_for`` picks the
source with the nearest TP and estimates the collectives from the file's TP sweep (``estimate_collectives``).
Scaling a model onto itself returns it unchanged (up to rounding).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import nnls

from tessera.serving.gpus import GpuSpec
from tessera.serving.models import ModelSpec
from tessera.serving.perf_fit import DecodeStep, PiecewiseLinear

HBM_EFFICIENCY = 0.85  # the fraction of peak HBM bandwidth that a decode step's weight and KV reads reach


@dataclass(frozen=True, slots=True)
class ReplicaShape:
    """One replica's physics: a model on a GPU type over ``tensor_parallel`` GPUs."""

    spec: ModelSpec
    gpu: GpuSpec
    tensor_parallel: int

    def __post_init__(self) -> None:
        if self.tensor_parallel < 1:
            raise ValueError(f"tensor_parallel must be >= 1, got {self.tensor_parallel}")

    def weights_read_s(self, hbm_efficiency: float = HBM_EFFICIENCY) -> float:
        """Seconds to read one GPU's share of the weights."""
        return self.spec.weights_bytes / self.tensor_parallel / (self.gpu.hbm_bytes_per_s * hbm_efficiency)

    def kv_read_s_per_token(self, hbm_efficiency: float = HBM_EFFICIENCY) -> float:
        """Seconds to read one context token's keys and values on one GPU."""
        shards = min(self.tensor_parallel, self.spec.kv_heads)
        return self.spec.kv_bytes_per_token / shards / (self.gpu.hbm_bytes_per_s * hbm_efficiency)

    def token_compute_s(self) -> float:
        """Seconds of one token's forward-pass FLOPs on one GPU at peak throughput."""
        return self.spec.flops_per_token / self.tensor_parallel / self.gpu.flops_per_s

    def describe(self) -> str:
        return f"{self.spec.name} on {self.tensor_parallel}x {self.gpu.name}"


@dataclass(frozen=True, slots=True)
class Collectives:
    """What tensor parallelism costs the measured engine beyond splitting the work, estimated from a TP sweep of one
    model on one GPU type (``estimate_collectives``); zero when unknown (then a TP change scales work only).

    - ``decode_s_per_layer_rank``: decode-step overhead per layer per rank beyond the first (all-reduce latency
      grows with the ring: 2 (TP - 1) steps per all-reduce);
    - ``prefill_peer_efficiency``: the fraction of the peer link's bandwidth that prefill's activation all-reduces
      reach (two per layer of tokens x hidden values, 2 (TP - 1) / TP of them on the link); 0 = not modelled."""

    decode_s_per_layer_rank: float = 0.0
    prefill_peer_efficiency: float = 0.0

    def __post_init__(self) -> None:
        if self.decode_s_per_layer_rank < 0 or not 0 <= self.prefill_peer_efficiency <= 1:
            raise ValueError(f"collectives out of range: {self}")

    def decode_overhead_s(self, shape: ReplicaShape) -> float:
        return shape.spec.layers * self.decode_s_per_layer_rank * (shape.tensor_parallel - 1)

    def prefill_token_s(self, shape: ReplicaShape) -> float:
        """Seconds of one prefill token's all-reduce traffic on the peer link."""
        if self.prefill_peer_efficiency == 0 or shape.tensor_parallel == 1:
            return 0.0
        return _allreduce_bytes_per_token(shape) / (shape.gpu.peer_gb_s * 1e9 * self.prefill_peer_efficiency)


def _allreduce_bytes_per_token(shape: ReplicaShape) -> float:
    tp = shape.tensor_parallel
    return 2 * shape.spec.layers * shape.spec.hidden * shape.spec.dtype_bytes * 2 * (tp - 1) / tp


@dataclass(frozen=True, slots=True)
class ScalingAssumptions:
    hbm_efficiency: float = HBM_EFFICIENCY
    per_seq_fixed_fraction: float = 0.5
    collectives: Collectives = Collectives()

    def __post_init__(self) -> None:
        if not 0 < self.hbm_efficiency <= 1:
            raise ValueError(f"hbm_efficiency must be in (0, 1], got {self.hbm_efficiency}")
        if not 0 <= self.per_seq_fixed_fraction <= 1:
            raise ValueError(f"per_seq_fixed_fraction must be in [0, 1], got {self.per_seq_fixed_fraction}")


def scale_decode(step: DecodeStep, src: ReplicaShape, dst: ReplicaShape, assume: ScalingAssumptions) -> DecodeStep:
    """The decode step of ``dst`` derived from ``step`` measured on ``src`` (see the module docstring)."""
    weights_src = min(src.weights_read_s(assume.hbm_efficiency), step.intercept_s)
    weights_ratio = dst.weights_read_s(assume.hbm_efficiency) / src.weights_read_s(assume.hbm_efficiency)
    # The engine's overhead: per layer, plus the collectives' share that grows with the TP ring.
    collectives = assume.collectives
    per_layer_s = max(step.intercept_s - weights_src - collectives.decode_overhead_s(src), 0.0) / src.spec.layers
    overhead_dst = per_layer_s * dst.spec.layers + collectives.decode_overhead_s(dst)
    intercept = overhead_dst + weights_src * weights_ratio
    fixed = assume.per_seq_fixed_fraction
    per_seq_ratio = fixed + (1.0 - fixed) * dst.token_compute_s() / src.token_compute_s()
    # Per KV token: the bandwidth-bound read scales with the KV bytes per GPU; what the fit found beyond it is the
    # engine's inefficiency per context token, which scales with the layers like the other overheads.
    kv_floor_src = src.kv_read_s_per_token(assume.hbm_efficiency)
    kv_read = min(step.per_kv_token_s, kv_floor_src) * dst.kv_read_s_per_token(assume.hbm_efficiency) / kv_floor_src
    kv_excess = max(step.per_kv_token_s - kv_floor_src, 0.0) * dst.spec.layers / src.spec.layers
    return DecodeStep(
        intercept_s=intercept,
        per_seq_s=step.per_seq_s * per_seq_ratio,
        per_seq_sq_s=step.per_seq_sq_s * per_seq_ratio,
        per_kv_token_s=kv_read + kv_excess,
        max_batch=step.max_batch,
    )


def scale_prefill(
    curve: PiecewiseLinear,
    src_intercept_s: float,
    dst_intercept_s: float,
    src: ReplicaShape,
    dst: ReplicaShape,
    assume: ScalingAssumptions,
) -> PiecewiseLinear:
    """The prefill curve of ``dst``: its decode intercept plus the source's work above the source's intercept,
    scaled by FLOPs per token per GPU over peak FLOPs, and its all-reduce share (``Collectives``) by the all-reduce
    bytes over the peer bandwidth."""
    compute_ratio = dst.token_compute_s() / src.token_compute_s()
    comm_src = assume.collectives.prefill_token_s(src)
    per_token_src = (curve.ys[-1] - src_intercept_s) / curve.xs[-1]  # the work per token at the largest batch
    comm_share = min(comm_src / per_token_src, 1.0) if comm_src > 0 and per_token_src > 0 else 0.0
    comm_ratio = assume.collectives.prefill_token_s(dst) / comm_src if comm_share else 0.0
    work_ratio = (1.0 - comm_share) * compute_ratio + comm_share * comm_ratio
    ys = tuple(dst_intercept_s + work_ratio * max(y - src_intercept_s, 0.0) for y in curve.ys)
    return PiecewiseLinear(curve.xs, ys)  # a monotone map of non-decreasing knots: still non-decreasing


def estimate_collectives(
    fits: Sequence[tuple[ReplicaShape, DecodeStep, PiecewiseLinear]], hbm_efficiency: float = HBM_EFFICIENCY
) -> Collectives:
    """The collective costs that explain how the fits of one model on one GPU type change with TP (least squares,
    non-negative), or zero costs when fewer than two TPs are given.

    Decode: the overhead per layer (intercept less the weight read) against TP - 1. Prefill: the work per token at
    the largest measured batch against (FLOPs per token per GPU, all-reduce bytes per token over the peer
    bandwidth); the second coefficient is one over the peer efficiency."""
    if len({shape.tensor_parallel for shape, _, _ in fits}) < 2:
        return Collectives()
    ranks, per_layer, compute, traffic, per_token = [], [], [], [], []
    for shape, step, curve in fits:
        weights = min(shape.weights_read_s(hbm_efficiency), step.intercept_s)
        ranks.append(shape.tensor_parallel - 1.0)
        per_layer.append((step.intercept_s - weights) / shape.spec.layers)
        compute.append(shape.token_compute_s())
        traffic.append(_allreduce_bytes_per_token(shape) / (shape.gpu.peer_gb_s * 1e9))
        per_token.append(max(curve.ys[-1] - step.intercept_s, 0.0) / curve.xs[-1])
    (_, per_rank), _ = nnls(np.column_stack([np.ones(len(ranks)), ranks]), np.array(per_layer))
    (_, inverse_efficiency), _ = nnls(np.column_stack([compute, traffic]), np.array(per_token))
    efficiency = min(1.0 / inverse_efficiency, 1.0) if inverse_efficiency > 0 else 0.0
    return Collectives(decode_s_per_layer_rank=float(per_rank), prefill_peer_efficiency=float(efficiency))
