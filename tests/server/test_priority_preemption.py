"""Priority classes in the control plane (preset ``tessera``, LAS within classes): an ``inference-critical`` workload
preempts a ``training`` one of its own queue at once, even one that has just started (the preemption guard only holds
back LAS churn within a class), the victim is requeued, and it runs again once room returns; a ``service`` too."""

from __future__ import annotations

from typing import Any

import pytest
from server_harness import ADMIN, Harness, MakeHarness

SHARES: list[dict[str, Any]] = [{"gpu_fraction": 0.6}, {}]  # 60% of a GPU each (they cannot share), or whole GPUs


def _tenant_token(h: Harness) -> str:
    """A tenant with its own queue of one GPU: its workloads run in that queue (not the preset's one queue)."""
    body = {"name": "team", "tenant": "team", "cohort": "lab", "nominal": {"*": {"gpus": 1}}}
    response = h.http.post("/v1/queues", json=body, headers=h.as_(ADMIN))
    assert response.status_code == 201, response.text
    return str(h.http.post("/v1/tokens", json={"tenant": "team"}, headers=h.as_(ADMIN)).json()["token"])


def _kinds(h: Harness, workload_id: object) -> list[str]:
    return [e["kind"] for e in h.http.get(f"/v1/workloads/{workload_id}/events", headers=h.as_(ADMIN)).json()]


def _launches(h: Harness, workload_id: object) -> int:
    return sum(1 for spec in h.backend.launched if spec.workload_id == str(workload_id))


@pytest.mark.parametrize("share", SHARES, ids=["fraction", "whole-gpu"])
@pytest.mark.parametrize("own_queue", [False, True], ids=["default-queue", "tenant-queue"])
@pytest.mark.parametrize("kind", ["batch", "service"])
def test_inference_critical_preempts_a_fresh_training_run_of_its_queue_and_the_victim_runs_again(
    make_harness: MakeHarness, share: dict[str, Any], own_queue: bool, kind: str
) -> None:
    h = make_harness("1xA100-80GB")
    token = _tenant_token(h) if own_queue else ADMIN
    low = h.submit(token, gpus=1, priority="training", kind=kind, **share)["id"]
    h.step()
    assert h.get(low)["state"] == "running"
    assert h.get(low)["queue"] == ("team" if own_queue else "default")

    high = h.submit(token, gpus=1, priority="inference-critical", **share)["id"]
    h.clock.advance(1)  # one second into the training run: well within the preemption guard's minimum run time
    h.step()
    assert [w for w, _ in h.backend.stops] == [str(low)]  # before the fix: none, and high waited 600 s
    assert h.get(high)["state"] == "running"  # bound, launched once the victim has exited
    events = h.http.get(f"/v1/workloads/{low}/events", headers=h.as_(ADMIN)).json()
    assert events[-1]["kind"] == "preempted" and f"priority for {high}" in events[-1]["message"]

    h.clock.advance(1)
    h.step()  # the victim exited: the preemptor launches, the victim waits again
    assert _launches(h, high) == 1
    assert h.get(low)["state"] == "pending" and _kinds(h, low)[-2:] == ["preempted", "requeued"]

    h.clock.advance(1)
    h.step()
    assert h.get(low)["state"] == "pending" and _launches(h, low) == 1  # no room yet: it does not preempt back

    h.backend.finish(str(high), 0)  # room returns
    h.clock.advance(1)
    h.step()
    h.clock.advance(1)
    h.step()
    assert h.get(high)["state"] == "succeeded"
    again = h.get(low)
    assert again["state"] == "running" and again["attempts"] == 2 and _launches(h, low) == 2


def test_a_training_run_is_still_guarded_against_training_of_its_class(make_harness: MakeHarness) -> None:
    """The guard is kept where it belongs: a second training workload (same class, same LAS level) neither
    preempts the first nor makes it churn; it starts when the first ends."""
    h = make_harness("1xA100-80GB")
    first = h.submit(gpus=1, priority="training")["id"]
    h.step()
    second = h.submit(gpus=1, priority="training")["id"]
    h.clock.advance(1)
    h.step()
    assert h.backend.stops == [] and h.get(second)["state"] == "pending"
    h.backend.finish(str(first), 0)
    h.clock.advance(1)
    h.step()
    assert h.get(second)["state"] == "running"


@pytest.mark.parametrize("share", SHARES, ids=["fraction", "whole-gpu"])
def test_preemption_never_loops_the_evicted_service_waits_and_never_evicts_the_winner(
    make_harness: MakeHarness, share: dict[str, Any]
) -> None:
    """The product promise "preemption never loops", as two replicas live it: the high-priority one (here a batch
    job the test can end) evicts the idle low-priority service once; then, over two hours of ticks (the winner's
    guard expired long ago, LAS levels dropped), the evicted one waits and preempts nothing, and nothing is stopped
    again. It runs once the winner ends."""
    h = make_harness("1xA100-80GB")
    low = h.submit(gpus=1, priority="training", kind="service", **share)["id"]
    h.step()
    high = h.submit(gpus=1, priority="inference-critical", **share)["id"]  # a batch job: it ends when told
    h.clock.advance(1)
    h.step()
    assert [w for w, _ in h.backend.stops] == [str(low)]
    for _ in range(2 * 60):  # a tick a minute for two hours
        h.clock.advance(60)
        h.step()
        assert h.get(low)["state"] == "pending" and h.get(high)["state"] == "running"
    assert [w for w, _ in h.backend.stops] == [str(low)]  # no stop after the one eviction
    assert _kinds(h, high).count("preempted") == 0 and _kinds(h, low).count("preempted") == 1
    assert _launches(h, high) == 1 and _launches(h, low) == 1
    h.backend.finish(str(high), 0)
    for _ in range(2):
        h.clock.advance(1)
        h.step()
    assert h.get(low)["state"] == "running" and _launches(h, low) == 2
