"""The store's bulk paths that one scheduling step relies on (on SQLite and on PostgreSQL when ``make test`` runs
one): many changes with different columns in one transaction, the light read of pending requests, and a step that
stores all its launches' handles at once."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest
from server_harness import MakeHarness

from tessera.backends.base import Handle, LaunchSpec
from tessera.backends.fake import FakeBackend
from tessera.core.workload import WorkloadState
from tessera.server.store.changes import (
    BindChange,
    EndChange,
    ReasonChange,
    RequeueChange,
    StopChange,
    StopKind,
    StopReason,
    WorkloadChange,
    columns_of,
)
from tessera.server.store.db import open_engine
from tessera.server.store.models import WorkloadRow
from tessera.server.store.store import Event, Store


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    url = f"sqlite:///{tmp_path / 'store.db'}" if request.param == "sqlite" else request.getfixturevalue("postgres_url")
    return Store(open_engine(str(url)))


def _row(state: str = "pending", **columns: object) -> WorkloadRow:
    values: dict[str, object] = {
        "name": "w",
        "tenant": "t",
        "queue": "q",
        "kind": "batch",
        "state": state,
        "priority": 0,
        "priority_class": "",
        "preemptible": True,
        "num_gpus": 1,
        "gpu_milli": 500,
        "gpu_mem_mib": 0,
        "gpu_types": "",
        "cpu_milli": 1000,
        "mem_mib": 64,
        "command": ["true"],
        "env": {},
        "submitted_at": 10.0,
        "reason": "",
        "attempts": 0,
        "cancel_requested": False,
    }
    values.update(columns)
    return WorkloadRow(**values)


def test_changes_with_different_columns_apply_in_one_call(store: Store) -> None:
    a = store.add_workload(_row(placement=[{"node": "n"}], admission={"queue": "q"}), 1.0)
    b = store.add_workload(_row(), 1.0)
    changes: list[WorkloadChange] = [
        RequeueChange(a.id, "requeued"),
        ReasonChange(b.id, "waiting"),
        BindChange(b.id, [{"node": "n"}], None, 4.0, 2),
        ReasonChange(b.id, "still waiting"),  # a later change of the same row wins
    ]
    store.update_workloads(changes, [Event(a.id, "requeued", "x"), Event(b.id, "pending", "y")], 5.0)
    got_a, got_b = store.get_workload(a.id), store.get_workload(b.id)
    assert got_a is not None and got_b is not None
    assert (got_a.state, got_a.placement, got_a.admission, got_a.reason) == ("pending", None, None, "requeued")
    assert (got_b.state, got_b.reason, got_b.attempts, got_b.started_at) == ("running", "still waiting", 2, 4.0)
    assert [(e.kind, e.at) for e in store.events(a.id)] == [("submitted", 1.0), ("requeued", 5.0)]
    store.update_workloads([StopChange(b.id, StopReason.watchdog("x" * 300))], [], 6.0)
    stored = store.get_workload(b.id)
    assert stored is not None and stored.stop_reason == ("watchdog: " + "x" * 300)[:200]
    store.update_workloads([EndChange(b.id, WorkloadState.FAILED, 3, 7.0, "exit code 3")], [], 7.0)
    ended = store.get_workload(b.id)
    assert ended is not None and (ended.state, ended.exit_code, ended.finished_at) == ("failed", 3, 7.0)
    with pytest.raises(TypeError):
        store.update_workloads([{"id": a.id, "reason": "a dict"}], [], 6.0)  # type: ignore[list-item]


def test_stop_reasons_are_stored_as_text_and_parsed_back() -> None:
    for reason in (StopReason.cancel(), StopReason.preempted("reclaim"), StopReason.watchdog("over by 2 GiB")):
        assert StopReason.parse(reason.text()) == reason
    assert StopReason.cancel().text() == "cancel"
    assert StopReason.preempted("reclaim: queue b").text() == "preempted: reclaim: queue b"
    assert StopReason.parse("preempted: reclaim: queue b").detail == "reclaim: queue b"
    assert StopReason.parse("something else").kind is StopKind.PREEMPTED  # as the loop always treated it
    assert columns_of(ReasonChange(1, "w")) == {"id": 1, "reason": "w"}


def test_many_workloads_getting_the_same_values_are_updated_together(store: Store) -> None:
    ids = [store.add_workload(_row(), 1.0).id for _ in range(1203)]  # more than one IN list of 500
    reasons = {wid: ("no room" if wid % 3 else f"own reason {wid}") for wid in ids}
    store.update_workloads([ReasonChange(wid, reasons[wid]) for wid in ids], [], 2.0)
    freed, alone = ids[:700], ids[700]
    changes = [RequeueChange(wid, reasons[wid]) for wid in freed]
    store.update_workloads(changes, [], 3.0)  # grouped where the reasons are the same
    store.update_workloads([RequeueChange(alone, reasons[alone])], [], 3.0)  # alone
    rows = {row.id: row for row in store.workloads_by_id(ids)}
    assert {wid: rows[wid].reason for wid in ids} == reasons
    assert all(rows[wid].placement is None and rows[wid].handle is None for wid in [*freed, alone])
    with store.engine.connect() as raw:  # a JSON None is stored the same way grouped or alone
        stored = raw.exec_driver_sql("SELECT DISTINCT placement IS NULL FROM workloads WHERE id <= 701").all()
    assert len(stored) == 1


def test_pending_requests_reads_only_pending_workloads(store: Store) -> None:
    waiting = store.add_workload(_row(gpu_types="A100-80GB,H100-80GB", priority=5), 1.0)
    running = store.add_workload(_row(state="running"), 1.0)
    rows = store.pending_requests([waiting.id, running.id, 999])
    assert [(r.id, r.gpu_types, r.priority, r.gpu_milli, r.queue) for r in rows] == [
        (waiting.id, "A100-80GB,H100-80GB", 5, 500, "q")
    ]


class _FailingLaunches(FakeBackend):
    """Refuses to start a process whose command is ``fail``."""

    def launch(self, spec: LaunchSpec) -> Handle:
        if spec.argv[0] == "fail":
            raise OSError("no such file: fail")
        return super().launch(spec)


def test_a_step_stores_every_launch_in_one_transaction_and_a_failed_launch_fails_alone(
    make_harness: MakeHarness,
) -> None:
    h = make_harness("2xA100-80GB", backend=_FailingLaunches())
    ids = [h.submit(gpus=1, gpu_fraction=0.25)["id"] for _ in range(5)]
    broken = h.submit(gpus=1, gpu_fraction=0.25, command=["fail"])["id"]
    store = h.server.ctx.store
    writes: list[int] = []
    update = store.update_workloads

    def counted(changes: Sequence[WorkloadChange], events: Sequence[Event], now_s: float) -> None:
        writes.append(len(changes))
        update(changes, events, now_s)

    commit = store.commit_decisions

    def counted_decisions(
        binds: Sequence[BindChange],
        pending_changes: Sequence[ReasonChange],
        changes: Sequence[WorkloadChange],
        events: Sequence[Event],
        now_s: float,
    ) -> set[int]:
        writes.append(len(binds) + len(pending_changes) + len(changes))
        return commit(binds, pending_changes, changes, events, now_s)

    store.update_workloads = counted  # type: ignore[method-assign]
    store.commit_decisions = counted_decisions  # type: ignore[method-assign,assignment]
    h.step()
    # The decisions (6 binds), the failed launch (1) and the refs of the five that started (5): three transactions.
    assert writes == [6, 1, 5]
    for wid in ids:
        row = store.get_workload(int(str(wid)))
        assert row is not None and row.state == "running" and row.handle is not None
        assert [e.kind for e in store.events(row.id)] == ["submitted", "bound", "started"]
    failed = h.get(broken)
    assert failed["state"] == "failed" and "could not start" in str(failed["reason"])
