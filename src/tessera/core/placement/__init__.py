"""Placement policies: one module per policy, all driven by the same ``Placer`` engine.

``PLACEMENTS`` is the registry (name -> a line saying what it does, and how it is built); ``make_policy`` builds one
by name. Policies that measure fragmentation need the target workload's typical pods, and the heterogeneity-aware
one (``hetero``) a throughput model and a way to read a request's job type.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

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
from tessera.core.placement.tessera_hetero import TesseraHeteroPolicy, Within
from tessera.core.throughput import ColocationModel, ThroughputModel
from tessera.core.workload import Request

# The six policies of the FGD study, in the paper's order.
FGD_STUDY_POLICIES: tuple[str, ...] = ("random", "dotprod", "clustering", "packing", "bestfit", "fgd")
# Tessera's own policy, given the workload's typical pods, and its online variant that learns them from arrivals.
TESSERA_POLICIES: tuple[str, ...] = ("tessera", "tessera-online")
SETUP_NAMES: tuple[str, ...] = FGD_STUDY_POLICIES + TESSERA_POLICIES
# Heterogeneity-aware placement (needs job types); kept out of SETUP_NAMES, which the FGD-study sweep validates.
HETERO_POLICIES: tuple[str, ...] = ("hetero",)


@dataclass(frozen=True, slots=True)
class PlacementInputs:
    """What a placement policy may be built from (each takes what it needs)."""

    typical: Sequence[TypicalPod] = ()  # the workload's typical pods (fragmentation-aware policies)
    model_names: Sequence[str] = ()  # the cluster's GPU models, by index
    throughput: ThroughputModel | None = None  # per job type and GPU model (hetero)
    job_type_of: Callable[[Request], str | None] | None = None  # how hetero reads a request's job type
    colocation: ColocationModel | None = None  # hetero's co-location rule, when the preset has it


@dataclass(frozen=True, slots=True)
class PlacementEntry:
    """One placement policy of the registry: its name, what it does in a line, how it is built."""

    name: str
    summary: str
    build: Callable[[PlacementInputs], PlacementPolicy]


def _hetero(inputs: PlacementInputs) -> PlacementPolicy:
    model = inputs.throughput if inputs.throughput is not None else ThroughputModel({})
    return HeteroPolicy(model, inputs.job_type_of, colocation=inputs.colocation)


def _tessera_hetero(within: Within) -> Callable[[PlacementInputs], PlacementPolicy]:
    def build(inputs: PlacementInputs) -> PlacementPolicy:
        model = inputs.throughput if inputs.throughput is not None else ThroughputModel({})
        return TesseraHeteroPolicy(
            model, tuple(inputs.model_names), inputs.job_type_of, inputs.colocation, within=within
        )

    return build


# The one registry of placement policies: ``make_policy``, ``tessera simulate`` and ``tessera up --placement`` all
# resolve names here, so a new policy is one module and one line.
PLACEMENTS: dict[str, PlacementEntry] = {
    entry.name: entry
    for entry in (
        PlacementEntry("random", "a random feasible GPU (FGD study baseline)", lambda i: RandomPolicy()),
        PlacementEntry("dotprod", "largest dot product of request and free resources", lambda i: DotProdPolicy()),
        PlacementEntry("clustering", "GPUs already shared by the same kind of pod", lambda i: ClusteringPolicy()),
        PlacementEntry("packing", "GPUs already in use first, then idle ones", lambda i: PackingPolicy()),
        PlacementEntry("bestfit", "the node left with the least free capacity", lambda i: BestFitPolicy()),
        PlacementEntry(
            "fgd", "least growth of fragmentation (FGD, ATC '23)",
            lambda i: FgdPolicy(FragmentationModel(i.typical, i.model_names)),
        ),
        PlacementEntry(
            "tessera", "fragmentation-aware with shape reserves and gap prices, typical pods given",
            lambda i: TesseraPolicy(i.typical, i.model_names, online=False),
        ),
        PlacementEntry(
            "tessera-online", "tessera learning the typical pods from arrivals",
            lambda i: TesseraPolicy(i.typical, i.model_names, online=True),
        ),
        PlacementEntry(
            "hetero", "the GPU model fastest for the job type, best fit among equals (best fit without a type)",
            _hetero,
        ),
        PlacementEntry("tessera-hetero", "hetero's GPU model, best fit, then tessera-online", _tessera_hetero("pack")),
        PlacementEntry("tessera-hetero-frag", "hetero's GPU model, then tessera-online", _tessera_hetero("frag")),
        PlacementEntry(
            "tessera-hetero-shares", "hetero's GPU model, tessera-online for shares, best fit for the rest",
            _tessera_hetero("shares"),
        ),
    )
}  # fmt: skip


def make_policy(
    name: str,
    typical: Sequence[TypicalPod] = (),
    model_names: Sequence[str] = (),
    *,
    throughput: ThroughputModel | None = None,
    job_type_of: Callable[[Request], str | None] | None = None,
    colocation: ColocationModel | None = None,
) -> PlacementPolicy:
    """The policy called ``name`` (``PLACEMENTS``); ``typical`` and ``model_names`` feed fragmentation-aware
    policies.

    ``hetero`` ranks GPU types by ``throughput`` (default: an empty table, i.e. the catalog's relative speeds) for
    the job type ``job_type_of`` reads from a request; without ``job_type_of`` it places like ``bestfit``. With
    ``colocation`` it lets two training jobs share a GPU only when that is a net gain (``placement.hetero``).
    """
    entry = PLACEMENTS.get(name)
    if entry is None:
        raise InvalidRequestError("policy", f"unknown policy {name!r} (known: {', '.join(PLACEMENTS)})")
    return entry.build(PlacementInputs(typical, model_names, throughput, job_type_of, colocation))


__all__ = [
    "FGD_STUDY_POLICIES",
    "PLACEMENTS",
    "PlacementEntry",
    "PlacementInputs",
    "HETERO_POLICIES",
    "HeteroPolicy",
    "SETUP_NAMES",
    "TESSERA_POLICIES",
    "TesseraParams",
    "NodeScores",
    "PlacementPolicy",
    "Placer",
    "TieBreak",
    "make_policy",
    "should_colocate",
]
