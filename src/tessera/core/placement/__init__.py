"""Placement policies: one module per policy, all driven by the same ``Placer`` engine.

``make_policy`` builds one by name; policies that measure fragmentation need the target workload's typical pods,
and the heterogeneity-aware ones (``HETERO_POLICIES``) a throughput model and a way to read a request's job type.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from tessera.core.errors import InvalidRequestError
from tessera.core.fragmentation import FragmentationModel, TypicalPod
from tessera.core.placement.base import NodeScores, PlacementPolicy, Placer, TieBreak
from tessera.core.placement.bestfit import BestFitPolicy
from tessera.core.placement.clustering import ClusteringPolicy
from tessera.core.placement.dotprod import DotProdPolicy
from tessera.core.placement.fgd import FgdPolicy
from tessera.core.placement.hetero import HeteroPolicy, should_colocate
from tessera.core.placement.packing import PackingPolicy
from tessera.core.placement.random import RandomPolicy
from tessera.core.placement.tessera import TesseraParams, TesseraPolicy
from tessera.core.throughput import ColocationModel, ThroughputModel
from tessera.core.workload import Request

# The six policies of the FGD study, in the paper's order.
FGD_STUDY_POLICIES: tuple[str, ...] = ("random", "dotprod", "clustering", "packing", "bestfit", "fgd")
# Tessera's own policy, given the workload's typical pods, and its online variant that learns them from arrivals.
TESSERA_POLICIES: tuple[str, ...] = ("tessera", "tessera-online")
POLICY_NAMES: tuple[str, ...] = FGD_STUDY_POLICIES + TESSERA_POLICIES
# Heterogeneity-aware placement (needs job types); kept out of POLICY_NAMES, which the FGD-study sweep validates.
HETERO_POLICIES: tuple[str, ...] = ("hetero",)


def make_policy(
    name: str,
    typical: Sequence[TypicalPod] = (),
    model_names: Sequence[str] = (),
    *,
    throughput: ThroughputModel | None = None,
    job_type_of: Callable[[Request], str | None] | None = None,
    colocation: ColocationModel | None = None,
) -> PlacementPolicy:
    """The policy called ``name``; ``typical`` and ``model_names`` feed fragmentation-aware policies.

    ``hetero`` ranks GPU types by ``throughput`` (default: an empty table, i.e. the catalog's relative speeds) for
    the job type ``job_type_of`` reads from a request; without ``job_type_of`` it places like ``bestfit``. With
    ``colocation`` it lets two training jobs share a GPU only when that is a net gain (``placement.hetero``).
    """
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
    if name in HETERO_POLICIES:
        model = throughput if throughput is not None else ThroughputModel({})
        return HeteroPolicy(model, job_type_of, colocation=colocation)
    known = ", ".join(POLICY_NAMES + HETERO_POLICIES)
    raise InvalidRequestError("policy", f"unknown policy {name!r} (known: {known})")


__all__ = [
    "FGD_STUDY_POLICIES",
    "HETERO_POLICIES",
    "HeteroPolicy",
    "POLICY_NAMES",
    "TESSERA_POLICIES",
    "TesseraParams",
    "NodeScores",
    "PlacementPolicy",
    "Placer",
    "TieBreak",
    "make_policy",
    "should_colocate",
]
