"""The FGD authors' published results (``analysis_allo_discrete.csv``), read by path for comparison.

Each row is one run (trace x policy x seed) with the GPU allocation % at every arrived-% bucket 0..130. Used by the
fidelity benchmark and test to compare Tessera's reproduction with the published means. The file is never copied
into the project.
"""

from __future__ import annotations

import csv
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from tessera.core.errors import InputFileError

# Policy labels of the published files and the names Tessera gives the same policies.
PUBLISHED_POLICY_NAMES: dict[str, str] = {
    "01-Random": "random",
    "02-DotProd": "dotprod",
    "03-GpuClustering": "clustering",
    "04-GpuPacking": "packing",
    "05-BestFit": "bestfit",
    "06-FGD": "fgd",
}


@dataclass(frozen=True, slots=True)
class PublishedRuns:
    """Unallocated GPU % at arrived 100% and 130%, one value per published seed."""

    trace: str
    policy: str
    seeds: tuple[int, ...]
    unallocated_100: tuple[float, ...]
    unallocated_130: tuple[float, ...]

    def mean(self, bucket: int) -> float:
        values = self.unallocated_100 if bucket == 100 else self.unallocated_130
        return sum(values) / len(values)


def load_published(path: str | Path) -> dict[tuple[str, str], PublishedRuns]:
    """Published runs keyed by (trace name, Tessera policy name); raises ``InputFileError`` on bad content."""
    grouped: dict[tuple[str, str], list[tuple[int, float, float]]] = defaultdict(list)
    with open(path, encoding="utf-8", newline="") as handle:
        for line, row in enumerate(csv.DictReader(handle), start=2):
            policy = PUBLISHED_POLICY_NAMES.get(row.get("sc_policy", ""))
            if policy is None:
                continue
            try:
                seed, alloc_100, alloc_130 = int(row["seed"]), float(row["100"]), float(row["130"])
            except (KeyError, TypeError, ValueError) as exc:
                raise InputFileError(str(path), line, None, f"unreadable published row ({exc})") from None
            grouped[(row["workload"], policy)].append((seed, 100.0 - alloc_100, 100.0 - alloc_130))
    result: dict[tuple[str, str], PublishedRuns] = {}
    for (trace, policy), runs in grouped.items():
        runs.sort()
        result[(trace, policy)] = PublishedRuns(
            trace, policy, tuple(r[0] for r in runs), tuple(r[1] for r in runs), tuple(r[2] for r in runs)
        )
    return result


@dataclass(frozen=True, slots=True)
class FidelityRow:
    """Published vs reproduced mean unallocated % for one (trace, policy, arrived bucket)."""

    trace: str
    policy: str
    bucket: int
    published: float
    ours: float

    @property
    def diff(self) -> float:
        return self.ours - self.published


def fidelity_tolerance_pp(trace: str, policy: str) -> float:
    """The acceptance band: +-0.5 pp for fgd and bestfit on the default trace, +-1.0 pp otherwise."""
    return 0.5 if trace == "openb_pod_list_default" and policy in ("fgd", "bestfit") else 1.0
