"""The API through an in-process server: sharing one GPU, waiting with a reason, cancel, tenants, bad input."""

from __future__ import annotations

import httpx
import pytest
from server_harness import ADMIN, MakeHarness

from tessera.api import API_VERSION, Health
from tessera.client.http import TesseraClient


def test_three_fractional_workloads_share_one_gpu_and_a_fourth_waits_with_a_reason(make_harness: MakeHarness) -> None:
    h = make_harness("1xA100-80GB")
    ids = [h.submit(gpus=1, gpu_fraction=0.3, name=f"share-{i}")["id"] for i in range(3)]
    fourth = h.submit(gpus=1, gpu_fraction=0.3, name="too-many")["id"]
    h.step()
    running = [h.get(i) for i in ids]
    assert [w["state"] for w in running] == ["running"] * 3
    assert {w["placement"][0]["uuids"][0] for w in running} == {h.server.ctx.pool.devices[0][0].uuid}
    waiting = h.get(fourth)
    assert waiting["state"] == "pending"
    assert "300" in str(waiting["reason"]) or "30" in str(waiting["reason"]), waiting["reason"]
    env = {s.workload_id: s.env for s in h.backend.launched}
    assert env[str(ids[0])]["TESSERA_GPU_MILLI"] == "300"
    assert env[str(ids[0])]["CUDA_VISIBLE_DEVICES"].startswith("SIM-")
    assert env[str(ids[0])]["TESSERA_WORKLOAD_ID"] == str(ids[0])

    h.backend.finish(str(ids[0]), 0)
    h.step()
    assert h.get(ids[0])["state"] == "succeeded"
    assert h.get(fourth)["state"] == "running"


def test_cancel_pending_and_running(make_harness: MakeHarness) -> None:
    h = make_harness("1xA100-80GB")
    running = h.submit(gpus=1)["id"]
    pending = h.submit(gpus=1)["id"]
    h.step()
    assert h.get(running)["state"] == "running"
    assert h.http.post(f"/v1/workloads/{pending}/cancel", headers=h.as_(ADMIN)).json()["state"] == "cancelled"
    assert h.http.post(f"/v1/workloads/{running}/cancel", headers=h.as_(ADMIN)).json()["state"] == "running"
    h.step()  # sends SIGTERM (the fake ends it at once)
    assert h.backend.stops == [(str(running), 10.0)]
    h.step()
    assert h.get(running)["state"] == "cancelled"


def test_missing_or_wrong_token_is_401(make_harness: MakeHarness) -> None:
    h = make_harness()
    assert h.http.get("/v1/workloads").status_code == 401
    assert h.http.get("/v1/workloads", headers=h.as_("nope")).status_code == 401
    assert h.http.get("/v1/workloads", headers={"Authorization": "Basic abc"}).status_code == 401


def test_tenants_see_only_their_own_workloads(make_harness: MakeHarness) -> None:
    h = make_harness("2xA100-80GB")
    tokens = {}
    for tenant in ("team-a", "team-b"):
        created = h.http.post("/v1/tokens", json={"tenant": tenant}, headers=h.as_(ADMIN))
        assert created.status_code == 201
        tokens[tenant] = created.json()["token"]
    a = h.submit(tokens["team-a"], gpus=1, gpu_fraction=0.5)["id"]
    assert h.get(a, tokens["team-a"])["queue"] == "team-a"
    assert h.http.get(f"/v1/workloads/{a}", headers=h.as_(tokens["team-b"])).status_code == 404
    assert h.http.post(f"/v1/workloads/{a}/cancel", headers=h.as_(tokens["team-b"])).status_code == 404
    assert h.http.get(f"/v1/workloads/{a}/logs", headers=h.as_(tokens["team-b"])).status_code == 404
    assert h.http.get("/v1/workloads", headers=h.as_(tokens["team-b"])).json() == []
    assert [w["id"] for w in h.http.get("/v1/workloads", headers=h.as_(ADMIN)).json()] == [a]
    # A tenant cannot submit into another tenant's queue, nor create tokens.
    bad = h.http.post("/v1/workloads", json={"command": ["x"], "queue": "team-a"}, headers=h.as_(tokens["team-b"]))
    assert bad.status_code == 422 and bad.json()["field"] == "queue"
    assert h.http.post("/v1/tokens", json={"tenant": "x"}, headers=h.as_(tokens["team-b"])).status_code == 403
    assert h.get(a, ADMIN)["tenant"] == "team-a"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"gpus": -1}, "gpus"),
        ({"gpus": 1, "gpu_fraction": 1.5}, "gpu_fraction"),
        ({"gpus": 1, "gpu_types": ["X100"]}, "gpu_types"),
        ({"gpus": 1, "gpu_types": ["T4"]}, "gpu_types"),
        ({"queue": "nope"}, "queue"),
        ({"gpus": 8}, "gpus"),
        ({"cpu": 1000}, "cpu"),
        ({"gpus": 1, "gpu_mem": "200GiB"}, "gpu_mem"),
        ({"mem": "ten gigs"}, "mem"),
        ({"priority": "urgent"}, "priority"),
        ({"gpus": 2, "gpu_fraction": 0.5}, "gpu_milli"),
        ({"gpu_fraction": 0.5}, "gpu_fraction"),
        ({"command": []}, "command"),
        ({"command": ["a\x00b"]}, "command.0"),
        ({"surprise": 1}, "surprise"),
    ],
)
def test_invalid_specs_are_422_naming_the_field(make_harness: MakeHarness, body: dict[str, object], field: str) -> None:
    h = make_harness("2xA100-80GB")
    body = {"command": ["true"], **body}
    response = h.http.post("/v1/workloads", json=body, headers=h.as_(ADMIN))
    assert response.status_code == 422, response.text
    assert response.json()["field"] == field
    assert field.split(".")[0] in response.json()["detail"]


def test_nodes_label_simulated_gpus_and_show_allocation(make_harness: MakeHarness) -> None:
    h = make_harness("2xA100-80GB,1xT4")
    w = h.submit(gpus=1, gpu_milli=250, gpu_types=["T4"])["id"]
    h.step()
    nodes = {n["name"]: n for n in h.http.get("/v1/nodes", headers=h.as_(ADMIN)).json()}
    assert set(nodes) == {"local/A100-80GB", "local/T4"}
    t4 = nodes["local/T4"]["gpus"][0]
    assert t4["simulated"] and t4["allocated_milli"] == 250 and t4["workloads"] == [w]
    assert h.get(w)["simulated_gpus"] is True


def test_metrics_expose_states_gpu_allocation_and_step_latency(make_harness: MakeHarness) -> None:
    h = make_harness("1xA100-80GB")
    h.submit(gpus=1, gpu_fraction=0.5)
    h.step()
    text = h.http.get("/metrics", headers=h.as_(ADMIN)).text  # queue labels only for an admin (test_tenant_leaks)
    assert 'tessera_workloads{queue="default",state="running"} 1.0' in text
    assert "tessera_gpu_allocated_ratio{" in text and 'simulated="true"' in text
    assert "tessera_scheduling_step_seconds_count 1.0" in text
    assert 'tessera_workload_pending_seconds_count{queue="default"} 1.0' in text


def test_healthz(make_harness: MakeHarness) -> None:
    h = make_harness()
    assert h.http.get("/healthz").json()["status"] == "ok"
    h.server.ctx.ready = False
    assert h.http.get("/healthz").status_code == 503


def test_the_server_reports_its_api_version_and_the_sdk_reads_it(make_harness: MakeHarness) -> None:
    h = make_harness("2xA100-80GB")
    assert h.http.get("/healthz").json()["api_version"] == API_VERSION
    assert h.server.app.openapi()["info"]["version"] == API_VERSION

    def forward(request: httpx.Request) -> httpx.Response:  # the SDK over the in-process app, no socket
        answer = h.http.request(request.method, request.url.path, headers=dict(request.headers))
        return httpx.Response(answer.status_code, headers=answer.headers, content=answer.content)

    with TesseraClient("http://tessera", ADMIN, transport=httpx.MockTransport(forward)) as client:
        health = Health(
            status="ok",
            simulated_gpus=True,
            gpus=2,
            api_version=API_VERSION,
            policy="tessera",
            placement="tessera-hetero",
        )
        assert client.health() == health
        assert client.api_version() == API_VERSION


def test_mps_limits_are_set_only_when_an_mps_daemon_serves_the_gpus(make_harness: MakeHarness) -> None:
    import dataclasses

    h = make_harness("1xA100-80GB")
    loop = h.server.ctx.loop
    loop.config = dataclasses.replace(loop.config, mps=True)
    h.submit(gpus=1, gpu_fraction=0.3, gpu_compute=20)
    h.submit(gpus=1, gpu_fraction=0.5)
    h.step()
    env = [s.env for s in h.backend.launched]
    assert env[0]["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "20"  # the explicit compute share
    assert env[1]["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"  # else the GPU share
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" in env[1]
