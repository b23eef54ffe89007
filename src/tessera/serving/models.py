"""The model catalog: architecture shapes, weight and KV-cache bytes, and the default tensor parallelism.

Shapes are the public architecture figures of each model family (layers, hidden size, attention and KV heads, head
dimension); parameters in billions. ``kv_bytes_per_token`` is what one token of context holds in the paged KV cache
across all layers (keys and values), ``weights_bytes`` what the weights take at the serving dtype.

``CATALOG`` holds the models the twin's default mix and the live sim engine play. ``GRID_MODELS`` holds the other
architectures of the Splitwise characterization grid (bloom-176b), known so that the grid's own measurements of them
calibrate the performance model and the twin can serve them by name. Any other model is brought by its Hugging Face
``config.json`` (``hf_config``) or a measured profile (``model_book``).
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
    active_params_b: float | None = None  # parameters one token runs through (mixture of experts); None: all

    def __post_init__(self) -> None:
        for name in ("layers", "hidden", "heads", "kv_heads", "head_dim", "dtype_bytes", "tensor_parallel"):
            if getattr(self, name) < 1:
                raise ValueError(f"model {self.name}: {name} must be >= 1")
        if self.params_b <= 0:
            raise ValueError(f"model {self.name}: params_b must be > 0")
        if self.active_params_b is not None and not 0 < self.active_params_b <= self.params_b:
            raise ValueError(f"model {self.name}: active_params_b must be in (0, params_b]")

    @property
    def weights_bytes(self) -> int:
        return int(self.params_b * 1e9 * self.dtype_bytes)

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes

    @property
    def flops_per_token(self) -> float:
        """Forward-pass FLOPs per token (2 x the parameters a token runs through), what prefill time scales with."""
        active = self.params_b if self.active_params_b is None else self.active_params_b
        return 2.0 * active * 1e9


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


# The Splitwise grid's other architecture (public figures): its measured rows calibrate the perf model for it.
GRID_MODELS: dict[str, ModelSpec] = {
    "bloom-176b": ModelSpec(
        "bloom-176b", 176.2, layers=70, hidden=14336, heads=112, kv_heads=112, head_dim=128, tensor_parallel=8
    ),
}
KNOWN_ARCHITECTURES: dict[str, ModelSpec] = {**CATALOG, **GRID_MODELS}

# The default tensor parallelism of a model outside the catalog: the fewest GPUs (a power of two, at most one node's
# eight) whose weight shard takes at most half of an 80 GB GPU, leaving the rest for its KV cache. It gives every
# catalog model's and bloom-176b's figure (tests/serving/test_hf_config.py checks it).
TP_SHARD_LIMIT_BYTES = 40 * GIB
MAX_DEFAULT_TP = 8


def default_tensor_parallel(weights_bytes: float) -> int:
    tp = 1
    while tp < MAX_DEFAULT_TP and weights_bytes / tp > TP_SHARD_LIMIT_BYTES:
        tp *= 2
    return tp


def model_spec(name: str) -> ModelSpec:
    try:
        return CATALOG[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r} (known: {', '.join(CATALOG)})") from None
