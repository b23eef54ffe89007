"""Placement policies: one module per policy, all driven by the same ``Placer`` engine.

``make_policy`` builds one by name; policies that measure fragmentation need the target workload's typical pods.
"""

from __future__ import annotations

from collections.abc import Sequence

from tessera.core.errors import InvalidRequestError
from tessera.core.fragmentation import FragmentationModel, TypicalPod
from tessera.core.placement.base import NodeScores, PlacementPolicy, Placer, TieBreak
from tessera.core.placement.bestfit import BestFitPolicy
from tessera.core.placement.clustering import ClusteringPolicy
from tessera.core.placement.dotprod import DotProdPolicy
from tessera.core.placement.fgd import FgdPolicy
from tessera.core.placement.packing import PackingPolicy
from tessera.core.placement.random import RandomPolicy
from tessera.core.placement.tessera import TesseraParams, TesseraPolicy

# The six policies of the FGD study, in the paper's order.
FGD_STUDY_POLICIES: tuple[str, ...] = ("random", "dotprod", "clustering", "packing", "bestfit", "fgd")
# Tessera's own policy, given the workload's typical pods, and its online variant that learns them from arrivals.
TESSERA_POLICIES: tuple[str, ...] = ("tessera", "tessera-online")
POLICY_NAMES: tuple[str, ...] = FGD_STUDY_POLICIES + TESSERA_POLICIES


def make_policy(name: str, typical: Sequence[TypicalPod] = (), model_names: Sequence[str] = ()) -> PlacementPolicy:
    """The policy called ``name``; ``typical`` and ``model_names`` feed fragmentation-aware policies."""
    simple: dict[str, type[PlacementPolicy]] = {
        "random": RandomPolicy,
        "dotprod": DotProdPolicy,
        "clustering": ClusteringPolicy,
        "packing": PackingPolicy,
        "bestfit": BestFitPolicy,
    }
    if name in simple:
        return simple[name]()
    if name == "fgd":
        return FgdPolicy(FragmentationModel(typical, model_names))
    if name in TESSERA_POLICIES:
        return TesseraPolicy(typical, model_names, online=name == "tessera-online")
    raise InvalidRequestError("policy", f"unknown policy {name!r} (known: {', '.join(POLICY_NAMES)})")


__all__ = [
    "FGD_STUDY_POLICIES",
    "POLICY_NAMES",
    "TESSERA_POLICIES",
    "TesseraParams",
    "NodeScores",
    "PlacementPolicy",
    "Placer",
    "TieBreak",
    "make_policy",
]
