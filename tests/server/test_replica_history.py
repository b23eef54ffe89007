"""Each served model's replicas over time (``server.replica_history``), as the serving controller publishes them: a
point when the counts change, bounded in time and number, gone with the model."""

from __future__ import annotations

from server_harness import FakeClock

from tessera.server.replica_history import ReplicaHistory
from tessera.serving.controller import ReplicaView
from tessera.serving.replicas import DeployedModel


def model(model_id: int, name: str = "chat") -> DeployedModel:
    return DeployedModel(model_id, name, "team-a", "team-a", "sim", "", 1, 250, 0, 0, 3, 30.0, "standard")


def test_a_point_is_kept_when_the_counts_change_with_ready_running_pending_and_desired() -> None:
    clock, desired = FakeClock(), {1: 2}
    proven = {(10, 0)}
    history = ReplicaHistory(clock, desired.get, lambda workload_id, attempt: (workload_id, attempt) in proven)
    chat = model(1)
    history.publish([chat], {1: [ReplicaView(10, True, "unix:/a"), ReplicaView(11, False, None)]})
    clock.advance(1)
    history.publish([chat], {1: [ReplicaView(10, True, "unix:/a"), ReplicaView(11, False, None)]})  # no change
    clock.advance(1)
    replicas = [ReplicaView(10, True, "unix:/a"), ReplicaView(11, True, "unix:/b"), ReplicaView(9, True, None, True)]
    history.publish([chat], {1: replicas})  # 11 runs, not proven yet; 9 is stopping (not counted)
    clock.advance(1)
    proven.add((11, 0))
    history.publish([chat], {1: replicas})
    points = [(p.ready, p.running, p.pending, p.desired) for p in history.points(1)]
    assert points == [(1, 1, 1, 2), (1, 2, 0, 2), (2, 2, 0, 2)]
    assert [p.at for p in history.points(1)] == [clock.now_s - 3, clock.now_s - 1, clock.now_s]


def test_without_a_gateway_running_is_ready_and_without_a_target_the_replicas_kept_are_desired() -> None:
    history = ReplicaHistory(FakeClock())
    history.publish([model(1)], {1: [ReplicaView(10, True, None), ReplicaView(11, False, None)]})
    (point,) = history.points(1)
    assert (point.ready, point.running, point.pending, point.desired) == (1, 1, 1, 2)


def test_old_points_go_but_the_one_in_force_when_the_window_begins_stays_and_a_deleted_model_loses_them() -> None:
    clock = FakeClock()
    history = ReplicaHistory(clock, window_s=100, max_points=3)
    chat, other = model(1), model(2, "other")
    for running in (1, 2, 3):
        history.publish([chat, other], {1: [ReplicaView(i, True, None) for i in range(running)]})
        clock.advance(60)
    assert [p.running for p in history.points(1)] == [2, 3]  # 1 began 180 s ago, superseded 120 s ago
    for running in (4, 5, 6, 7):
        history.publish([chat, other], {1: [ReplicaView(i, True, None) for i in range(running)]})
    assert [p.running for p in history.points(1)] == [5, 6, 7]  # at most max_points
    history.publish([chat], {})
    assert history.points(2) == [] and [p.running for p in history.points(1)][-1] == 0
