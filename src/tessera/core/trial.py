"""A scheduling step's tentative changes, with one undo log (``Trial``).

A step tries placements, victims' releases and elastic resizes on the live ``ClusterState`` (placement reads it) and
on its own copy of the quota ledger. Every change to the state goes through the trial, which logs it; ``mark`` and
``rollback`` undo the changes after a mark (a gang that did not fit, victims that would not make room), and
``rollback()`` at the end of the step undoes all of them, so the plan leaves the state as it found it. A mark may
also keep a copy of the ledger, restored by the same rollback. Used by ``core.step``, ``core.step_resize`` and
``core.victim_fit``; pure.
"""

from __future__ import annotations

from dataclasses import dataclass

from tessera.core.cluster import ClusterState
from tessera.core.queueing.quotas import QuotaLedger
from tessera.core.workload import Placement


@dataclass(frozen=True, slots=True)
class Mark:
    position: int  # entries of the log before the mark
    ledger: QuotaLedger | None  # the ledger as it was (None: the rollback leaves the ledger alone)


class Trial:
    """Tentative binds and releases on ``state`` and the step's ``ledger``, undone in reverse order."""

    def __init__(self, state: ClusterState, ledger: QuotaLedger) -> None:
        self.state = state
        self.ledger = ledger
        self._log: list[tuple[bool, Placement]] = []  # (bound, placement), in the order they happened

    def bind(self, placement: Placement) -> None:
        self.state.bind(placement)  # raises if it does not fit: nothing is logged
        self._log.append((True, placement))

    def release(self, placement: Placement) -> None:
        self.state.release(placement)
        self._log.append((False, placement))

    def mark(self, with_ledger: bool = False) -> Mark:
        return Mark(len(self._log), self.ledger.copy() if with_ledger else None)

    def rollback(self, mark: Mark | None = None) -> None:
        """Undo every change after ``mark`` (all of them without one), newest first; restore the ledger the mark
        kept."""
        position = 0 if mark is None else mark.position
        while len(self._log) > position:
            bound, placement = self._log.pop()
            if bound:
                self.state.release(placement)
            else:
                self.state.bind(placement)
        if mark is not None and mark.ledger is not None:
            self.ledger = mark.ledger
