"""The model catalog: architecture shapes, weight and KV-cache bytes, and the default tensor parallelism.

Shapes are the public architecture figures of each model family (layers, hidden size, attention and KV heads, head
dimension); parameters in billions. ``kv_bytes_per_token`` is what one token of context holds in the paged KV cache
across all layers (keys and values), ``weights_bytes`` what the weights take at the serving dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

GIB = 1024**3
MIB = 1024**2


@dataclass(frozen=True, slots=True)
class ModelSpec:
    name: str
    params_b: float  # parameters, billions
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    dtype_bytes: int = 2  # fp16/bf16
    tensor_parallel: int = 1  # GPUs one replica spans by default (80 GB GPUs)

    def __post_init__(self) -> None:
        for name in ("layers", "hidden", "heads", "kv_heads", "head_dim", "dtype_bytes", "tensor_parallel"):
            if getattr(self, name) < 1:
                raise ValueError(f"model {self.name}: {name} must be >= 1")
        if self.params_b <= 0:
            raise ValueError(f"model {self.name}: params_b must be > 0")

    @property
    def weights_bytes(self) -> int:
        return int(self.params_b * 1e9 * self.dtype_bytes)

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes

    @property
    def flops_per_token(self) -> float:
        """Forward-pass FLOPs per token (2 x parameters), what prefill time scales with."""
        return 2.0 * self.params_b * 1e9


CATALOG: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec("llama2-7b", 6.74, layers=32, hidden=4096, heads=32, kv_heads=32, head_dim=128),
        ModelSpec("llama3-8b", 8.03, layers=32, hidden=4096, heads=32, kv_heads=8, head_dim=128),
        ModelSpec("llama2-13b", 13.0, layers=40, hidden=5120, heads=40, kv_heads=40, head_dim=128),
        ModelSpec("codellama-34b", 33.7, layers=48, hidden=8192, heads=64, kv_heads=8, head_dim=128, tensor_parallel=2),
        ModelSpec("llama2-70b", 69.0, layers=80, hidden=8192, heads=64, kv_heads=8, head_dim=128, tensor_parallel=4),
    )
}


def model_spec(name: str) -> ModelSpec:
    try:
        return CATALOG[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r} (known: {', '.join(CATALOG)})") from None
