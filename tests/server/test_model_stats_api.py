"""``GET /v1/models/{name}/stats``: a model's recent requests against its SLO class's targets, its replicas over time
as the controller published them, and its serving setup; tenant-scoped as the other ``/v1/models`` routes."""

from __future__ import annotations

from typing import Any

from server_harness import ADMIN, Harness, MakeHarness

from tessera.server.replica_history import ReplicaHistory
from tessera.server.serving_plane import ServingPlane
from tessera.serving.controller import Controller
from tessera.serving.model_stats import ModelWindow, WindowConfig


def deploy(h: Harness, token: str = ADMIN, **body: Any) -> None:
    response = h.http.post("/v1/models", json=body, headers=h.as_(token))
    assert response.status_code == 201, response.text


def stats(h: Harness, name: str, token: str = ADMIN) -> dict[str, Any]:
    response = h.http.get(f"/v1/models/{name}/stats", headers=h.as_(token))
    assert response.status_code == 200, response.text
    out: dict[str, Any] = response.json()
    return out


def serve(h: Harness) -> tuple[Controller, ModelWindow]:
    """What ``tessera up`` wires: the gateway's window and the controller's replica history, on the test's clock."""
    plane = ServingPlane(h.server.ctx)
    history = h.server.ctx.replica_history = ReplicaHistory(h.clock, plane.desired.get)
    window = h.server.ctx.model_window = ModelWindow(WindowConfig(window_s=60, bucket_s=1), h.clock)
    return Controller(plane, sinks=[history]), window


def test_the_stats_of_a_model_show_its_requests_against_its_targets_its_replicas_and_its_setup(
    make_harness: MakeHarness,
) -> None:
    h = make_harness("1xA100-80GB")
    deploy(h, name="chat", engine="sim", gpu_fraction=0.25, min_replicas=2, max_replicas=3, slo="interactive",
           router="prefix-affinity")  # fmt: skip
    controller, window = serve(h)
    controller.tick(h.clock())
    h.step()
    h.clock.advance(2)
    controller.tick(h.clock())  # the replicas run now
    for ttft_s in (0.1, 0.2, 3.0):  # the last is over the interactive target (2 s)
        window.record("chat", 200, ttft_s <= 2.0, ttft_s, 0.01)
    window.record("chat", 502, False, None, None)
    h.clock.advance(60)  # a minute old: the window spans all of it
    out = stats(h, "chat")
    assert out["targets"] == {"ttft_s": 2.0, "tpot_s": 0.2}
    w = out["window"]
    assert (w["requests"], w["errors"], w["slo_met"], w["samples"]) == (4, 1, 2, 3)
    assert w["rate_per_s"] == 4 / 60 and w["slo_attainment_pct"] == 50.0
    assert (w["ttft_p50_s"], w["ttft_p99_s"], w["tpot_p99_s"]) == (0.2, 3.0, 0.01)
    counts = [(p["running"], p["pending"], p["desired"]) for p in out["replicas"]]
    assert counts == [(0, 2, 2), (2, 0, 2)]  # pending at the first tick, running at the next
    assert out["replicas"][-1]["ready"] == 2 and out["replicas"][-1]["at"] <= out["now"]
    assert out["setup"] == {
        "serving_setup": "tessera", "router": "prefix-affinity", "autoscaler": "tessera", "slo": "interactive",
        "min_replicas": 2, "max_replicas": 3, "idle_timeout_s": 30.0, "replica_concurrency": 32,
    }  # fmt: skip


def test_another_tenants_model_is_404_and_the_admin_sees_every_model(make_harness: MakeHarness) -> None:
    h = make_harness("1xA100-80GB")
    tokens = {t: h.http.post("/v1/tokens", json={"tenant": t}, headers=h.as_(ADMIN)).json()["token"] for t in "ab"}
    deploy(h, tokens["a"], name="mine-a", engine="sim", gpu_fraction=0.25)
    serve(h)
    assert stats(h, "mine-a", tokens["a"])["tenant"] == "a"
    assert stats(h, "mine-a", ADMIN)["name"] == "mine-a"
    for name, token in (("mine-a", tokens["b"]), ("nobody", tokens["a"])):
        response = h.http.get(f"/v1/models/{name}/stats", headers=h.as_(token))
        assert response.status_code == 404 and response.json()["detail"] == f"no model {name!r}"
    assert h.http.get("/v1/models/mine-a/stats").status_code == 401


def test_a_server_without_a_gateway_has_no_request_window_and_no_replica_history(make_harness: MakeHarness) -> None:
    h = make_harness("1xA100-80GB")
    deploy(h, name="chat", engine="sim", gpu_fraction=0.25)
    out = stats(h, "chat")
    assert out["window"] is None and out["replicas"] == [] and out["targets"] == {"ttft_s": 10.0, "tpot_s": 0.5}


def test_the_replicas_gauge_counts_the_ready_ones_apart_from_the_running(make_harness: MakeHarness) -> None:
    h = make_harness("1xA100-80GB")
    deploy(h, name="chat", engine="sim", gpu_fraction=0.25, min_replicas=2, max_replicas=2)
    controller, _ = serve(h)
    controller.tick(h.clock())
    h.step()
    first = min(w["id"] for w in h.http.get("/v1/workloads", headers=h.as_(ADMIN)).json())
    h.server.ctx.metrics.states.replica_ready = lambda workload_id, attempt: workload_id == first  # one proven
    scrape = h.http.get("/metrics", headers=h.as_(ADMIN)).text
    assert 'tessera_model_replicas{kind="running",served_model="chat"} 2.0' in scrape
    assert 'tessera_model_replicas{kind="ready",served_model="chat"} 1.0' in scrape
    assert 'tessera_model_replicas{kind="desired",served_model="chat"} 2.0' in scrape
