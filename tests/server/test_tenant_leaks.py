"""What one tenant could learn of or do to another through the API (issue 17, defect 7): workload ids on
``/v1/nodes``, queue names on ``/metrics``, the admin's default queue seen by a tenant called ``default``, and a new
tenant's token taking over another tenant's queue."""

from __future__ import annotations

from server_harness import ADMIN, Harness, MakeHarness


def _tenant(h: Harness, tenant: str) -> tuple[str, str]:
    created = h.http.post("/v1/tokens", json={"tenant": tenant}, headers=h.as_(ADMIN))
    assert created.status_code == 201, created.text
    return created.json()["token"], created.json()["queue"]


def _workloads_on_gpus(h: Harness, token: str) -> set[int]:
    nodes = h.http.get("/v1/nodes", headers=h.as_(token)).json()
    return {w for node in nodes for gpu in node["gpus"] for w in gpu["workloads"]}


def test_a_tenant_sees_only_its_own_workload_ids_on_the_nodes(make_harness: MakeHarness) -> None:
    h = make_harness("2xA100-80GB")
    a, _ = _tenant(h, "team-a")
    b, _ = _tenant(h, "team-b")
    mine = h.submit(a, gpus=1, gpu_fraction=0.5)["id"]
    theirs = h.submit(b, gpus=1, gpu_fraction=0.5)["id"]
    admins = h.submit(gpus=1, gpu_fraction=0.5)["id"]
    h.step()
    assert _workloads_on_gpus(h, ADMIN) == {mine, theirs, admins}
    assert _workloads_on_gpus(h, a) == {mine}
    assert _workloads_on_gpus(h, b) == {theirs}
    allocated = sum(g["allocated_milli"] for n in h.http.get("/v1/nodes", headers=h.as_(a)).json() for g in n["gpus"])
    assert allocated == 1500  # the allocation itself is not hidden: it is what the tenant can get


def test_metrics_name_queues_only_for_an_admin(make_harness: MakeHarness) -> None:
    h = make_harness()
    a, queue = _tenant(h, "secret-tenant")
    h.submit(a, gpus=1, gpu_fraction=0.5)
    h.step()
    anonymous = h.http.get("/metrics")
    assert anonymous.status_code == 200
    assert "secret-tenant" not in anonymous.text and 'queue="' not in anonymous.text
    assert (
        "tessera_gpu_allocated_ratio{" in anonymous.text and "tessera_scheduling_step_seconds_count" in anonymous.text
    )
    assert "secret-tenant" not in h.http.get("/metrics", headers=h.as_(a)).text  # a tenant sees the public part
    assert f'queue="{queue}"' in h.http.get("/metrics", headers=h.as_(ADMIN)).text
    assert h.http.get("/metrics", headers=h.as_("wrong")).status_code == 401


def test_no_tenant_called_default_sees_the_admins_default_queue(make_harness: MakeHarness) -> None:
    h = make_harness()
    admins = h.submit()["id"]  # into the default queue
    refused = h.http.post("/v1/tokens", json={"tenant": "default"}, headers=h.as_(ADMIN))
    assert refused.status_code == 422 and refused.json()["field"] == "tenant", refused.text
    old = "tsr_a-token-an-older-server-made-for-tenant-default"
    h.server.ctx.store.add_token(old, "default", False, "", h.clock())
    assert h.http.get(f"/v1/workloads/{admins}", headers=h.as_(old)).status_code == 401
    assert h.http.get("/v1/workloads", headers=h.as_(old)).status_code == 401


def test_a_new_tenants_token_never_takes_over_another_tenants_queue(make_harness: MakeHarness) -> None:
    h = make_harness()
    for name, tenant in (("y", "x"), ("y-queue", "z")):
        body = {"name": name, "tenant": tenant, "nominal": {"*": {"gpus": 0.5}}}
        assert h.http.post("/v1/queues", json=body, headers=h.as_(ADMIN)).status_code == 201
    y, queue = _tenant(h, "y")
    assert queue not in ("y", "y-queue")
    queues = {q["name"]: q for q in h.http.get("/v1/queues", headers=h.as_(ADMIN)).json()}
    assert (queues["y"]["tenant"], queues["y-queue"]["tenant"], queues[queue]["tenant"]) == ("x", "z", "y")
    assert queues["y-queue"]["nominal"] == {"*": {"gpu_milli": 500}}  # its quota is kept
    assert [q["name"] for q in h.http.get("/v1/queues", headers=h.as_(y)).json()] == [queue]


def test_a_tenant_with_a_long_name_gets_a_queue_whose_name_fits(make_harness: MakeHarness) -> None:
    h = make_harness()
    long = "t" * 100
    body = {"name": long, "tenant": "other", "nominal": {}}
    assert h.http.post("/v1/queues", json=body, headers=h.as_(ADMIN)).status_code == 201
    _, queue = _tenant(h, long)
    assert len(queue) <= 100 and queue != long
