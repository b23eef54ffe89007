"""GPU catalog: the models Tessera knows, their memory and a relative speed.

Used by trace loaders and request validation to resolve names (``"V100M32"``, ``"h100"``) to one ``GpuModel``
and by heterogeneity-aware policies as a fallback speed when no measured throughput exists.

``relative_speed`` is a rough dense training throughput relative to a V100 (1.0). The Alibaba trace's ``G2`` and
``G3`` models are undisclosed: their memory and speed are placeholders, flagged with ``disclosed=False``.
"""

from __future__ import annotations

from dataclasses import dataclass

from tessera.core.errors import UnknownGpuModelError

MIB_PER_GIB = 1024


@dataclass(frozen=True, slots=True)
class GpuModel:
    name: str  # canonical name, e.g. "A100-80GB"
    family: str  # what a user may write to accept every variant, e.g. "A100"
    mem_mib: int  # device memory
    relative_speed: float  # training throughput relative to a V100
    disclosed: bool = True  # False when the trace hides the real model


_MODELS: tuple[GpuModel, ...] = (
    # The models of the Alibaba openb trace.
    GpuModel("G2", "G2", 16 * MIB_PER_GIB, 1.0, disclosed=False),
    GpuModel("G3", "G3", 32 * MIB_PER_GIB, 1.0, disclosed=False),
    GpuModel("A10", "A10", 24 * MIB_PER_GIB, 0.9),
    GpuModel("P100", "P100", 16 * MIB_PER_GIB, 0.5),
    GpuModel("T4", "T4", 16 * MIB_PER_GIB, 0.45),
    GpuModel("V100M16", "V100", 16 * MIB_PER_GIB, 1.0),
    GpuModel("V100M32", "V100", 32 * MIB_PER_GIB, 1.0),
    # Common current models.
    GpuModel("A100-40GB", "A100", 40 * MIB_PER_GIB, 2.2),
    GpuModel("A100-80GB", "A100", 80 * MIB_PER_GIB, 2.4),
    GpuModel("H100-80GB", "H100", 80 * MIB_PER_GIB, 4.5),
    GpuModel("H200", "H200", 141 * MIB_PER_GIB, 5.0),
    GpuModel("L4", "L4", 24 * MIB_PER_GIB, 0.8),
    GpuModel("L40S", "L40S", 48 * MIB_PER_GIB, 2.0),
    GpuModel("RTX4090", "RTX4090", 24 * MIB_PER_GIB, 1.6),
)

_ALIASES: dict[str, str] = {
    "V100": "V100M16",
    "V100-16GB": "V100M16",
    "V100-32GB": "V100M32",
    "H100": "H100-80GB",
    "RTX-4090": "RTX4090",
}


def _key(name: str) -> str:
    return name.strip().upper().replace("_", "-").replace(" ", "-")


_BY_KEY: dict[str, GpuModel] = {_key(m.name): m for m in _MODELS}
_BY_KEY.update({_key(alias): _BY_KEY[_key(target)] for alias, target in _ALIASES.items()})


def all_models() -> tuple[GpuModel, ...]:
    """Every model in the catalog, in a stable order."""
    return _MODELS


def model_names() -> tuple[str, ...]:
    return tuple(m.name for m in _MODELS)


def resolve_model(name: str) -> GpuModel:
    """The catalog entry for ``name`` (case-insensitive, aliases accepted); raises ``UnknownGpuModelError``."""
    model = _BY_KEY.get(_key(name))
    if model is None:
        known = ", ".join(model_names())
        raise UnknownGpuModelError("gpu_type", f"unknown GPU type {name!r} (known: {known})")
    return model


def resolve_allowed(names: str | list[str] | tuple[str, ...] | frozenset[str]) -> frozenset[str]:
    """Canonical model names that a type constraint allows.

    A family name (``A100``) allows all its variants; an exact name or alias allows that model only.
    ``names`` may be a ``|``- or ``,``-separated string. Empty means any model: the empty set.
    """
    if isinstance(names, str):
        parts = [p for p in names.replace(",", "|").split("|") if p.strip()]
    else:
        parts = [p for p in names if p.strip()]
    allowed: set[str] = set()
    for part in parts:
        family = [m.name for m in _MODELS if _key(m.family) == _key(part) and _key(part) not in _BY_KEY]
        if family:
            allowed.update(family)
        else:
            allowed.add(resolve_model(part).name)
    return frozenset(allowed)
