"""What the control plane changes on a stored workload, as typed values: the scheduler loop builds them, ``Store``
turns them into column values (``columns_of``) and writes many at once. Also the reason a stop was sent
(``StopReason``), stored as text in ``stop_reason`` ("cancel", "preempted: ...", "watchdog: ...") and read back
in one place (``StopReason.parse``).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from tessera.backends.base import Handle
from tessera.core.workload import WorkloadState

STOP_REASON_MAX = 200  # the column's length

PlacementRecord = dict[str, Any]  # one worker's stored placement: {"node", "gpus", "gpu_milli", "uuids"}
AdmissionRecord = dict[str, Any]  # the stored quota charge (``server.records.admission_record``)


class StopKind(enum.Enum):
    CANCEL = "cancel"  # the user cancelled it
    PREEMPTED = "preempted"  # the scheduler took its capacity for another workload
    WATCHDOG = "watchdog"  # the memory watchdog found it over its allowance
    TIMEOUT = "timeout"  # it ran past its walltime (``--time``)
    RESIZE = "resize"  # an elastic workload's workers changed: it restarts on its new placements


@dataclass(frozen=True, slots=True)
class StopReason:
    """Why the loop sent a workload a stop; decides what its end means (cancelled, requeued, failed)."""

    kind: StopKind
    detail: str = ""  # the preemption's or the watchdog's reason; empty for a cancel

    @classmethod
    def cancel(cls) -> StopReason:
        return cls(StopKind.CANCEL)

    @classmethod
    def preempted(cls, reason: str) -> StopReason:
        return cls(StopKind.PREEMPTED, reason)

    @classmethod
    def watchdog(cls, reason: str) -> StopReason:
        return cls(StopKind.WATCHDOG, reason)

    @classmethod
    def timeout(cls, reason: str) -> StopReason:
        return cls(StopKind.TIMEOUT, reason)

    @classmethod
    def resize(cls, reason: str) -> StopReason:
        return cls(StopKind.RESIZE, reason)

    def text(self) -> str:
        """The stored (and shown) form."""
        return self.kind.value if self.kind is StopKind.CANCEL else f"{self.kind.value}: {self.detail}"

    @classmethod
    def parse(cls, text: str) -> StopReason:
        """The reason ``text()`` stored; text that no kind starts with is read as a preemption (so the workload is
        stopped and waits again, as the loop always treated a stop it did not recognise)."""
        if text == StopKind.CANCEL.value:
            return cls.cancel()
        for kind in (StopKind.PREEMPTED, StopKind.WATCHDOG, StopKind.TIMEOUT, StopKind.RESIZE):
            if text.startswith(kind.value):
                return cls(kind, text.removeprefix(kind.value).removeprefix(":").strip())
        return cls.preempted(text)


@dataclass(frozen=True, slots=True)
class BindChange:
    """A pending workload was placed: it runs from now (its process may start later)."""

    workload_id: int
    placement: list[PlacementRecord]
    admission: AdmissionRecord | None
    started_at: float
    attempts: int


@dataclass(frozen=True, slots=True)
class ReasonChange:
    """Why a pending workload waits."""

    workload_id: int
    reason: str


@dataclass(frozen=True, slots=True)
class StopChange:
    """A stop was sent to a running workload."""

    workload_id: int
    stop: StopReason


@dataclass(frozen=True, slots=True)
class HandleChange:
    """The backend launched (or found) the workload: how to find it again."""

    workload_id: int
    handle: Handle


@dataclass(frozen=True, slots=True)
class EndChange:
    """The workload ended for good (succeeded, failed, cancelled, preempted)."""

    workload_id: int
    state: WorkloadState
    exit_code: int | None
    finished_at: float
    reason: str


@dataclass(frozen=True, slots=True)
class RequeueChange:
    """The workload waits again (preempted, a service that exited, a pool that changed): placement, quota charge,
    stop and handle are cleared."""

    workload_id: int
    reason: str


@dataclass(frozen=True, slots=True)
class ResizeChange:
    """An elastic workload's workers changed (a shrink or a grow): where it runs now and its quota charge; what its
    run used so far (GPU- and CPU-seconds of its earlier placements) and since when the new one counts."""

    workload_id: int
    placement: list[PlacementRecord]
    admission: AdmissionRecord | None
    gpu_s_settled: float
    cpu_s_settled: float
    settled_at: float


@dataclass(frozen=True, slots=True)
class RelaunchChange:
    """The workload's processes ended to restart it where it is placed (a resize): it is launched again, as
    launch number ``attempts``; its last handle and stop are cleared."""

    workload_id: int
    attempts: int


WorkloadChange = (
    BindChange | ReasonChange | StopChange | HandleChange | EndChange | RequeueChange | ResizeChange | RelaunchChange
)


def columns_of(change: WorkloadChange) -> dict[str, Any]:
    """The workload columns ``change`` sets, with ``id``."""
    match change:
        case BindChange():
            columns: dict[str, Any] = {
                "state": WorkloadState.RUNNING.value,
                "placement": change.placement,
                "admission": change.admission,
                "started_at": change.started_at,
                "attempts": change.attempts,
                "reason": "",
                "stop_reason": None,
                "handle": None,
                "gpu_s_settled": 0.0,
                "cpu_s_settled": 0.0,
                "settled_at": None,
            }
        case ReasonChange():
            columns = {"reason": change.reason}
        case StopChange():
            columns = {"stop_reason": change.stop.text()[:STOP_REASON_MAX]}
        case HandleChange():
            columns = {"handle": change.handle.to_json()}
        case EndChange():
            columns = {
                "state": change.state.value,
                "exit_code": change.exit_code,
                "finished_at": change.finished_at,
                "reason": change.reason,
            }
        case RequeueChange():
            columns = {
                "state": WorkloadState.PENDING.value,
                "placement": None,
                "admission": None,
                "stop_reason": None,
                "handle": None,
                "reason": change.reason,
                "exit_code": None,
            }
        case ResizeChange():
            columns = {
                "placement": change.placement,
                "admission": change.admission,
                "gpu_s_settled": change.gpu_s_settled,
                "cpu_s_settled": change.cpu_s_settled,
                "settled_at": change.settled_at,
            }
        case RelaunchChange():
            columns = {"attempts": change.attempts, "stop_reason": None, "handle": None}
        case _:
            raise TypeError(f"not a workload change: {change!r}")
    return {"id": change.workload_id, **columns}
