"""Models deployed through ``/v1/models`` become replica workloads that the scheduler places and the serving
controller scales; bad deployments are refused naming the field; tenants see only their own models."""

from __future__ import annotations

from typing import Any

import pytest
from server_harness import ADMIN, Harness, MakeHarness

from tessera.server.serving_plane import ServingPlane
from tessera.serving.controller import Controller, Demand


class Traffic:
    """The gateway's side of the controller, set by hand: demand per model key."""

    def __init__(self) -> None:
        self.now: dict[str, Demand] = {}

    def take_demand(self, model_key: str) -> Demand:
        return self.now.get(model_key, Demand())


def deploy(h: Harness, token: str = ADMIN, **body: Any) -> dict[str, Any]:
    response = h.http.post("/v1/models", json=body, headers=h.as_(token))
    assert response.status_code == 201, response.text
    out: dict[str, Any] = response.json()
    return out


def model(h: Harness, name: str, token: str = ADMIN) -> dict[str, Any]:
    response = h.http.get(f"/v1/models/{name}", headers=h.as_(token))
    assert response.status_code == 200, response.text
    out: dict[str, Any] = response.json()
    return out


def controller(h: Harness, traffic: Traffic | None = None) -> Controller:
    return Controller(ServingPlane(h.server.ctx), traffic or Traffic())


def test_a_deployed_model_runs_its_minimum_of_replicas_as_service_workloads_sharing_one_gpu(
    make_harness: MakeHarness,
) -> None:
    h = make_harness("1xA100-80GB")
    out = deploy(h, name="chat", engine="sim", gpu_fraction=0.25, min_replicas=2, max_replicas=4)
    assert out["state"] == "deploying" and out["replicas"] == 0
    assert out["openai_base_url"].endswith("/openai/v1")
    c = controller(h)
    c.tick(h.clock())
    h.step()
    shown = model(h, "chat")
    assert shown["state"] == "ready" and shown["replicas"] == 2, shown
    replicas = [h.get(i) for i in shown["replica_workloads"]]
    assert {w["kind"] for w in replicas} == {"service"}
    assert {w["placement"][0]["uuids"][0] for w in replicas} == {h.server.ctx.pool.devices[0][0].uuid}
    assert all(w["gpu_milli"] == 250 and w["priority_class"] == "inference-critical" for w in replicas)
    launched = {s.workload_id: s for s in h.backend.launched}
    command = list(launched[str(replicas[0]["id"])].argv)
    assert command[1:4] == ["-m", "tessera.serving.engine_exec", "sim"] and "--port" in command
    assert launched[str(replicas[0]["id"])].env["TESSERA_GPU_MILLI"] == "250"


def test_a_model_scales_from_zero_when_requests_are_held_and_back_to_zero_after_its_idle_timeout(
    make_harness: MakeHarness,
) -> None:
    h = make_harness("1xA100-80GB")
    deploy(h, name="burst", engine="sim", gpu_fraction=0.5, min_replicas=0, max_replicas=2, idle_timeout="30s")
    traffic = Traffic()
    c = controller(h, traffic)
    c.tick(h.clock())
    assert model(h, "burst")["state"] == "scaled-to-zero"
    traffic.now["default/burst"] = Demand(held=3, arrivals=3, last_request_s=h.clock())
    c.tick(h.clock())
    h.step()
    assert model(h, "burst")["replicas"] == 1
    traffic.now["default/burst"] = Demand(last_request_s=h.clock())  # served; nothing more comes
    for _ in range(40):
        h.clock.advance(1.0)
        c.tick(h.clock())
        h.step()
    h.step()
    shown = model(h, "burst")
    assert shown["replicas"] == 0 and shown["desired_replicas"] == 0 and shown["state"] == "scaled-to-zero", shown
    assert all(w["state"] == "cancelled" for w in h.http.get("/v1/workloads", headers=h.as_(ADMIN)).json())


def test_deleting_a_model_stops_its_replicas_then_forgets_it(make_harness: MakeHarness) -> None:
    h = make_harness("1xA100-80GB")
    deploy(h, name="old", engine="sim", gpu_fraction=0.25)
    c = controller(h)
    c.tick(h.clock())
    h.step()
    assert h.http.delete("/v1/models/old", headers=h.as_(ADMIN)).json()["state"] == "deleting"
    c.tick(h.clock())
    h.step()
    h.step()
    c.tick(h.clock())
    assert h.http.get("/v1/models/old", headers=h.as_(ADMIN)).status_code == 404
    assert [w["state"] for w in h.http.get("/v1/workloads", headers=h.as_(ADMIN)).json()] == ["cancelled"]


def test_replicas_count_against_the_tenants_quota(make_harness: MakeHarness) -> None:
    h = make_harness("2xA100-80GB")
    quota = {"name": "team-a", "tenant": "team-a", "nominal": {"*": {"gpus": 0.5}}}
    assert h.http.post("/v1/queues", json=quota, headers=h.as_(ADMIN)).status_code == 201
    token = h.http.post("/v1/tokens", json={"tenant": "team-a"}, headers=h.as_(ADMIN)).json()["token"]
    deploy(h, token, name="chat", engine="sim", gpu_fraction=0.25, min_replicas=3, max_replicas=3)
    controller(h).tick(h.clock())
    h.step()
    shown = model(h, "chat", token)
    assert shown["replicas"] == 2 and len(shown["replica_workloads"]) == 3, shown


def test_tenants_see_and_touch_only_their_own_models(make_harness: MakeHarness) -> None:
    h = make_harness("1xA100-80GB")
    tokens = {t: h.http.post("/v1/tokens", json={"tenant": t}, headers=h.as_(ADMIN)).json()["token"] for t in "ab"}
    for tenant, token in tokens.items():
        deploy(h, token, name=f"mine-{tenant}", engine="sim", gpu_fraction=0.25)
    for tenant, token in tokens.items():
        listed = h.http.get("/v1/models", headers=h.as_(token)).json()
        assert [(m["tenant"], m["name"]) for m in listed] == [(tenant, f"mine-{tenant}")]
    assert len(h.http.get("/v1/models", headers=h.as_(ADMIN)).json()) == 2
    assert h.http.get("/v1/models?tenant=a", headers=h.as_(ADMIN)).json()[0]["name"] == "mine-a"
    # Clients name a model alone, so a name is taken for everyone: 409, not a second "mine-a".
    taken = h.http.post("/v1/models", json={"name": "mine-a"}, headers=h.as_(tokens["b"]))
    assert taken.status_code == 409
    deploy(h, tokens["a"], name="only-a", engine="sim", gpu_fraction=0.25)
    assert h.http.get("/v1/models/only-a", headers=h.as_(tokens["b"])).status_code == 404
    assert h.http.delete("/v1/models/only-a", headers=h.as_(tokens["b"])).status_code == 404
    assert model(h, "only-a", tokens["a"])["state"] != "deleting"


@pytest.mark.parametrize(
    ("body", "status", "field"),
    [
        ({"name": "x", "engine": "vllm"}, 422, "model"),
        ({"name": "x", "engine": "vllm", "model": "/"}, 422, "model"),  # issue 25: the keeper would walk the host
        ({"name": "x", "engine": "vllm", "model": "/proc/self"}, 422, "model"),
        ({"name": "x", "engine": "transformers", "model": "/srv/models/../../etc"}, 422, "model"),
        ({"name": "x", "engine": "sim", "model": "gpt-17"}, 422, "model"),
        ({"name": "x", "engine": "tgi"}, 422, "engine"),
        ({"name": "no spaces", "engine": "sim"}, 422, "name"),
        ({"name": "x", "gpu_fraction": 0.5, "gpu_mem": "10GiB"}, 422, "gpu_fraction"),
        ({"name": "x", "gpus": 0, "gpu_fraction": 0.5}, 422, "gpu_fraction"),
        ({"name": "x", "min_replicas": 3, "max_replicas": 2}, 422, "max_replicas"),
        ({"name": "x", "idle_timeout": "soon"}, 422, "idle_timeout"),
        ({"name": "x", "idle_timeout": -1}, 422, "idle_timeout"),
        ({"name": "x", "gpus": 4}, 422, "gpus"),  # the pool has one GPU: a replica could never run
        ({"name": "x", "gpu_mem": "200GiB"}, 422, "gpu_mem"),
        ({"name": "x", "queue": "nobody"}, 422, "queue"),
        ({"name": "x", "slo": "urgent"}, 422, "slo"),
        ({"name": "x", "router": "fastest"}, 422, "router"),
        ({"name": "x", "replicas": 2}, 422, "replicas"),
    ],
)
def test_a_deployment_that_could_never_run_is_refused_naming_the_field(
    make_harness: MakeHarness, body: dict[str, Any], status: int, field: str
) -> None:
    h = make_harness("1xA100-80GB")
    response = h.http.post("/v1/models", json=body, headers=h.as_(ADMIN))
    assert response.status_code == status, response.text
    assert response.json()["field"] == field, response.json()
    assert h.http.get("/v1/models", headers=h.as_(ADMIN)).json() == []


def test_a_second_model_of_the_same_name_is_409(make_harness: MakeHarness) -> None:
    h = make_harness()
    deploy(h, name="dup", engine="sim", gpu_fraction=0.25)
    response = h.http.post("/v1/models", json={"name": "dup"}, headers=h.as_(ADMIN))
    assert response.status_code == 409 and "already deployed" in response.json()["detail"]


def test_each_model_is_routed_by_its_own_router(make_harness: MakeHarness) -> None:
    """``models deploy --router``: the gateway's route of a model carries its router (the twin's names); a model
    deployed without one keeps least-load, as every model had before."""
    from tessera.server.serving_plane import deployed
    from tessera.server.store import served
    from tessera.serving.gateway.bridge import route_of
    from tessera.serving.policies.router import ROUTER_NAMES

    h = make_harness()
    assert deploy(h, name="chat", engine="sim", gpu_fraction=0.25, router="prefix-affinity")["router"] == (
        "prefix-affinity"
    )
    plain = deploy(h, name="plain", engine="sim", gpu_fraction=0.25)  # no router: the serving setup's
    assert (plain["router"], plain["serving_setup"], plain["autoscaler"]) == ("prefix-affinity", "tessera", "tessera")
    assert deploy(h, name="lean", engine="sim", gpu_fraction=0.25, router="least-load")["router"] == "least-load"
    rows = {name: served.model(h.server.ctx.store, name) for name in ("chat", "plain", "lean")}
    setup = h.server.ctx.serving_setup
    routes = {name: route_of(deployed(row), setup) for name, row in rows.items() if row is not None}
    assert [routes[n].router for n in ("chat", "plain", "lean")] == ["prefix-affinity", "prefix-affinity", "least-load"]
    schema = h.http.get("/openapi.json").json()["components"]["schemas"]["ModelDeploy"]["properties"]["router"]
    named = next(choice for choice in schema["anyOf"] if "enum" in choice)  # the other choice: null (the setup's)
    assert tuple(named["enum"]) == ROUTER_NAMES  # the wire type lists exactly the routers the gateway knows
