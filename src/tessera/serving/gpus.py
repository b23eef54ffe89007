"""Serving GPU specifications: the figures the performance model and the model cache need.

Names resolve through the core catalog (``tessera.core.catalog.resolve_model``), so that ``"h100"``, ``"H100-80GB"``
and ``"h100_80gb"`` name one GPU and memory sizes agree with the placement engine's. The figures are the vendors'
public datasheet numbers for the SXM (or only) form factor:

- ``hbm_gb_s``: peak device-memory bandwidth, GB/s (10^9 bytes per second);
- ``dense_tflops``: peak dense (no sparsity) tensor throughput at bf16, or fp16 where the GPU has no bf16 (T4);
- ``pcie_h2d_gb_s``: host-to-device copy rate over PCIe that pinned memory reaches in practice (about 80% of the
  link's one-way peak: Gen5 x16 64 GB/s, Gen4 x16 32 GB/s, Gen3 x16 16 GB/s), used for weight loads from host memory;
- ``peer_gb_s``: one-way GPU-to-GPU bandwidth for tensor-parallel collectives (NVLink where the GPU has it, else
  the PCIe figure).

Who uses it: the performance model (``perf_roofline``, ``perf_scaling``) and the model cache's load times.
"""

from __future__ import annotations

from dataclasses import dataclass

from tessera.core.catalog import resolve_model
from tessera.core.errors import UnknownGpuModelError

GIB = 1024**3


@dataclass(frozen=True, slots=True)
class GpuSpec:
    name: str  # the core catalog's canonical name, e.g. "H100-80GB"
    memory_gib: float
    hbm_gb_s: float
    dense_tflops: float
    pcie_h2d_gb_s: float
    peer_gb_s: float

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gib * GIB)

    @property
    def hbm_bytes_per_s(self) -> float:
        return self.hbm_gb_s * 1e9

    @property
    def flops_per_s(self) -> float:
        return self.dense_tflops * 1e12


def _spec(name: str, hbm_gb_s: float, dense_tflops: float, pcie_h2d_gb_s: float, peer_gb_s: float) -> GpuSpec:
    # Memory comes from the core catalog, so that serving and placement agree on what fits on a GPU.
    memory_gib = resolve_model(name).mem_mib / 1024
    return GpuSpec(name, memory_gib, hbm_gb_s, dense_tflops, pcie_h2d_gb_s, peer_gb_s)


SERVING_GPUS: dict[str, GpuSpec] = {
    spec.name: spec
    for spec in (
        _spec("H100-80GB", hbm_gb_s=3350.0, dense_tflops=989.0, pcie_h2d_gb_s=50.0, peer_gb_s=450.0),
        _spec("H200", hbm_gb_s=4800.0, dense_tflops=989.0, pcie_h2d_gb_s=50.0, peer_gb_s=450.0),
        _spec("A100-80GB", hbm_gb_s=2039.0, dense_tflops=312.0, pcie_h2d_gb_s=25.0, peer_gb_s=300.0),
        _spec("A100-40GB", hbm_gb_s=1555.0, dense_tflops=312.0, pcie_h2d_gb_s=25.0, peer_gb_s=300.0),
        _spec("L4", hbm_gb_s=300.0, dense_tflops=121.0, pcie_h2d_gb_s=25.0, peer_gb_s=25.0),
        _spec("T4", hbm_gb_s=320.0, dense_tflops=65.0, pcie_h2d_gb_s=12.0, peer_gb_s=12.0),
    )
}


def gpu_spec(name: str) -> GpuSpec:
    """The serving figures of GPU ``name`` (any name or alias the core catalog accepts).

    Raises ``UnknownGpuModelError`` (field ``gpu``) for a name the catalog does not know, or one it knows but that
    has no serving figures here (e.g. a V100)."""
    canonical = resolve_model(name).name
    spec = SERVING_GPUS.get(canonical)
    if spec is None:
        known = ", ".join(SERVING_GPUS)
        raise UnknownGpuModelError("gpu", f"no serving figures for GPU {name!r} (known: {known})")
    return spec
