"""What stands between a pending workload and the scheduler, and the walltime of a running one: the job options
(``tessera submit --hold``, ``--dependency``, ``--array ...%N``, ``--time``) enforced by the loop, outside the core.

Each tick, before the scheduler is offered anything, ``Gate.eligible`` says which pending workloads it may see: not
a held one ("held"), not one whose dependency is not satisfied yet (its reason names the dependency and what it
waits for), not a task of an array already running as many tasks as its ``%N`` limit allows. A dependency that can
never be satisfied (``afterok`` on a workload that failed, ``afternotok`` on one that succeeded) ends its workload,
cancelled, with that reason. The core's step never sees a gated workload, so its decisions over the others are the
simulator's (``tests/server/test_same_decisions.py``). ``overdue`` lists the running workloads past their walltime;
the loop stops them as it stops a cancelled one (SIGTERM, grace, SIGKILL) and they end failed, "walltime ... exceeded".
"""

from __future__ import annotations

from collections.abc import Mapping

from tessera.api.job_options import Dependency, format_duration, parse_dependency
from tessera.core.workload import WorkloadState
from tessera.server.loop_values import RunningEntry
from tessera.server.store.changes import StopReason
from tessera.server.store.jobs import GateRow, pending_gates, running_per_array, states_of, write_gates
from tessera.server.store.store import Store

SUCCEEDED = WorkloadState.SUCCEEDED.value
ACTIVE = (WorkloadState.PENDING.value, WorkloadState.RUNNING.value)
HELD = "held (tessera release ID lets it be scheduled)"


class Gate:
    def __init__(self, store: Store) -> None:
        self.store = store

    def eligible(self, now_s: float) -> set[int]:
        """The pending workloads the scheduler may be offered now; the others' reasons (and the ends of those that
        can never run) are stored here."""
        rows = pending_gates(self.store)
        gated = [row for row in rows if row.held or row.dependency or row.array_limit]
        if not gated:
            return {int(row.id) for row in rows}
        blocked: dict[int, str] = {}
        ends: list[tuple[int, str]] = []
        needed = {wid for row in gated if row.dependency and not row.held for wid in _dependency(row).ids}
        states = states_of(self.store, needed) if needed else {}
        limited: dict[int, list[GateRow]] = {}
        for row in gated:
            if row.held:
                blocked[row.id] = HELD
                continue
            if row.dependency:
                verdict = dependency_verdict(_dependency(row), states)
                if verdict is not None:
                    never, why = verdict
                    if never:
                        ends.append((row.id, why))
                    else:
                        blocked[row.id] = why
                    continue
            if row.array_limit:
                limited.setdefault(int(row.array_id), []).append(row)
        blocked.update(_over_array_limits(limited, running_per_array(self.store, limited) if limited else {}))
        stored = {row.id: row.reason for row in gated}
        reasons = [(wid, why) for wid, why in blocked.items() if why != stored[wid]]
        write_gates(self.store, reasons, ends, now_s)
        stopped = blocked.keys() | {wid for wid, _ in ends}
        return {int(row.id) for row in rows if row.id not in stopped}


def dependency_verdict(dependency: Dependency, states: Mapping[int, str]) -> tuple[bool, str] | None:
    """None when ``dependency`` is satisfied (given the ``states`` of the workloads it names); else (never, why):
    never True when it can never be satisfied, False while it waits."""
    waiting: list[str] = []
    for wid in dependency.ids:
        state = states.get(wid)
        if state is None:
            return True, f"dependency {dependency.text()} can never be satisfied: workload {wid} does not exist"
        if state in ACTIVE:
            waiting.append(f"{wid} ({state})")
        elif dependency.kind != "afterany" and (state == SUCCEEDED) != (dependency.kind == "afterok"):
            return True, f"dependency {dependency.text()} can never be satisfied: workload {wid} {state}"
    if waiting:
        return False, f"waiting for dependency {dependency.text()}: workload {', '.join(waiting)}"
    return None


def overdue(running: Mapping[int, RunningEntry], now_s: float) -> list[tuple[int, StopReason]]:
    """The running workloads past their walltime (counted from the step that placed them), not yet being stopped."""
    return [
        (wid, StopReason.timeout(f"walltime {format_duration(entry.row.time_limit_s)} exceeded"))
        for wid, entry in running.items()
        if entry.row.time_limit_s is not None
        and entry.stop_sent is None
        and now_s - entry.started_s >= entry.row.time_limit_s
    ]


def _over_array_limits(limited: dict[int, list[GateRow]], running: Mapping[int, int]) -> dict[int, str]:
    """The tasks of each array beyond what its ``%N`` limit allows now (the lowest indices go first)."""
    blocked: dict[int, str] = {}
    for array_id, rows in limited.items():
        limit = int(rows[0].array_limit)
        now_running = running.get(array_id, 0)
        ordered = sorted(rows, key=lambda row: (row.array_index, row.id))
        for row in ordered[max(0, limit - now_running) :]:
            blocked[row.id] = f"array {array_id}: at most {limit} of its tasks run at once (%{limit})"
    return blocked


def _dependency(row: GateRow) -> Dependency:
    return parse_dependency(str(row.dependency))
