"""Accounting and queue administration through the API (in-process server, fake backend, a clock moved by hand):
``GET /v1/history`` keeps where and how long a workload ran after it ended, filters by time, state and queue, and
shows a tenant only its own; ``/v1/history/totals`` sums GPU-hours per tenant; ``DELETE /v1/queues/NAME`` refuses
while work of the queue is active. Also the default priority of a plain submit and logs read through the route."""

from __future__ import annotations

from typing import Any

from server_harness import ADMIN, Harness, MakeHarness

from tessera.cli.history import name_of


def history(h: Harness, token: str = ADMIN, **params: Any) -> list[dict[str, Any]]:
    response = h.http.get("/v1/history", params=params, headers=h.as_(token))
    assert response.status_code == 200, response.text
    result: list[dict[str, Any]] = response.json()
    return result


def tenant_token(h: Harness, tenant: str) -> str:
    response = h.http.post("/v1/tokens", json={"tenant": tenant}, headers=h.as_(ADMIN))
    assert response.status_code == 201, response.text
    return str(response.json()["token"])


def test_history_keeps_times_place_and_gpu_hours_after_the_end(make_harness: MakeHarness) -> None:
    h = make_harness("2xA100-80GB")
    t0 = h.clock()
    whole = h.submit(gpus=2, name="train")["id"]
    half = h.submit(gpus=1, gpu_fraction=0.5, name="half")["id"]  # waits: both GPUs are taken
    h.step()
    h.clock.advance(1800)
    h.backend.finish(str(whole), 0)
    h.step()  # whole ends, half starts
    h.clock.advance(3600)
    h.backend.finish(str(half), 1)
    h.step()
    records = {r["id"]: r for r in history(h)}
    train, halfr = records[whole], records[half]
    assert train["state"] == "succeeded" and train["exit_code"] == 0
    assert train["started_at"] == t0 and train["ended_at"] == t0 + 1800
    assert train["elapsed_s"] == 1800 and train["wait_s"] == 0
    assert train["gpus"] == 2 and train["gpu_hours"] == 1.0  # 2 GPUs x 0.5 h
    assert train["where"] == ["local GPU 0,1"] and len(train["gpu_uuids"]) == 2
    assert halfr["state"] == "failed" and halfr["wait_s"] == 1800 and halfr["elapsed_s"] == 3600
    assert halfr["gpus"] == 0.5 and halfr["gpu_hours"] == 0.5
    assert halfr["where"] and halfr["where"][0].startswith("local GPU ")

    assert [r["id"] for r in history(h, state=["failed"])] == [half]
    assert [r["id"] for r in history(h, since=t0 + 1801)] == [half]  # train had ended by then
    assert [r["id"] for r in history(h, until=t0 - 1)] == []
    assert [r["id"] for r in history(h, queue="nope")] == []

    totals = h.http.get("/v1/history/totals", headers=h.as_(ADMIN)).json()
    assert totals == [
        {
            "tenant": "default",
            "workloads": 2,
            "succeeded": 1,
            "failed": 1,
            "gpu_hours": 1.5,
            "cpu_hours": 0.0,
            "wait_s_mean": 900.0,
        }
    ]


def test_a_running_workload_counts_up_to_now_and_a_pending_one_not_at_all(make_harness: MakeHarness) -> None:
    h = make_harness("1xA100-80GB")
    running = h.submit(gpus=1)["id"]
    waiting = h.submit(gpus=1)["id"]
    h.step()
    h.clock.advance(360)
    records = {r["id"]: r for r in history(h)}
    assert records[running]["ended_at"] is None and records[running]["elapsed_s"] == 360
    assert records[running]["gpu_hours"] == 0.1
    assert records[waiting]["started_at"] is None and records[waiting]["gpu_hours"] == 0
    assert records[waiting]["wait_s"] == 360


def test_a_tenant_sees_only_its_own_history_and_totals(make_harness: MakeHarness) -> None:
    h = make_harness("1xA100-80GB")
    a, b = tenant_token(h, "team-a"), tenant_token(h, "team-b")
    mine = h.submit(a, gpus=0)["id"]
    h.submit(b, gpus=0)
    h.step()
    assert [r["id"] for r in history(h, a)] == [mine]
    assert [r["id"] for r in history(h, a, tenant="team-b")] == [mine]  # a tenant cannot ask for another
    assert {r["tenant"] for r in history(h)} == {"team-a", "team-b"}
    assert [r["tenant"] for r in history(h, tenant="team-b")] == ["team-b"]  # an admin may narrow
    totals = h.http.get("/v1/history/totals", headers=h.as_(a)).json()
    assert [t["tenant"] for t in totals] == ["team-a"]


def test_deleting_a_queue_is_refused_while_work_of_it_is_active(make_harness: MakeHarness) -> None:
    h = make_harness("1xA100-80GB")
    body = {"name": "q1", "tenant": "t1", "nominal": {"*": {"gpus": 1}}}
    assert h.http.post("/v1/queues", json=body, headers=h.as_(ADMIN)).status_code == 201
    token = tenant_token(h, "t1")
    running = h.submit(token, gpus=1, queue="q1")["id"]
    h.submit(token, gpus=1, queue="q1")
    h.step()
    refused = h.http.delete("/v1/queues/q1", headers=h.as_(ADMIN))
    assert refused.status_code == 409
    assert "1 pending and 1 running" in refused.json()["detail"]
    assert h.http.delete("/v1/queues/q1", headers=h.as_(token)).status_code == 403
    assert h.http.delete("/v1/queues/none", headers=h.as_(ADMIN)).status_code == 404

    for w in h.http.get("/v1/workloads", headers=h.as_(ADMIN)).json():
        h.http.post(f"/v1/workloads/{w['id']}/cancel", headers=h.as_(ADMIN))
    h.step()
    h.backend.finish(str(running), None)
    h.step()
    deleted = h.http.delete("/v1/queues/q1", headers=h.as_(ADMIN))
    assert deleted.status_code == 200, deleted.text
    assert "q1" not in [q["name"] for q in h.http.get("/v1/queues", headers=h.as_(ADMIN)).json()]
    assert {r["queue"] for r in history(h)} == {"q1"}  # ended workloads keep the name
    h.step()  # the scheduler drops the queue without trouble


def test_a_plain_submit_is_not_below_best_effort(make_harness: MakeHarness) -> None:
    h = make_harness("1xA100-80GB")
    plain = h.submit(gpus=0)
    best_effort = h.submit(gpus=0, priority="best-effort")
    assert plain["priority_class"] == "training" and plain["priority"] == 500
    assert plain["priority"] > best_effort["priority"]
    assert h.submit(gpus=0, priority=0)["priority"] == 0  # an explicit number is kept


def test_the_logs_route_never_cuts_a_character(make_harness: MakeHarness) -> None:
    """Before, each chunk was decoded on its own with errors="replace": a character cut by ``limit`` arrived as
    replacement characters."""
    h = make_harness("1xA100-80GB")
    wid = h.submit(gpus=0)["id"]
    text = "é€😀 " * 100 + "\nlast\n"
    path = h.server.ctx.loop.log_path(wid)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text.encode())
    got, offset = "", 0
    while True:
        chunk = h.http.get(f"/v1/workloads/{wid}/logs", params={"offset": offset, "limit": 5}, headers=h.as_(ADMIN))
        body = chunk.json()
        if body["next_offset"] == offset:
            break
        got += body["data"]
        offset = body["next_offset"]
    assert got == text
    tail = h.http.get(f"/v1/workloads/{wid}/logs", params={"tail": 1}, headers=h.as_(ADMIN)).json()
    assert tail["data"] == "last\n" and tail["offset"] == len(text.encode()) - 5


def test_why_pending_names_quota_or_capacity(make_harness: MakeHarness) -> None:
    """The reason a workload waits says which limit stops it: its queue's quota, or no free GPU; a second workload of
    a shape already refused in the step names the first and what that one waits for."""
    h = make_harness("2xA100-80GB")
    body = {"name": "q1", "tenant": "default", "nominal": {"*": {"gpus": 1}}}
    assert h.http.post("/v1/queues", json=body, headers=h.as_(ADMIN)).status_code == 201
    first = h.submit(gpus=1, queue="q1")["id"]
    over_quota = [h.submit(gpus=1, queue="q1")["id"] for _ in range(2)]
    h.step()
    fills = h.submit(gpus=1, queue="default")["id"]
    no_gpu = h.submit(gpus=1, queue="default")["id"]
    h.step()
    assert h.get(first)["state"] == "running" and h.get(fills)["state"] == "running"
    quota = "queue q1 has no quota left for 1 GPU"
    assert h.get(over_quota[0])["reason"] == quota
    assert (
        h.get(over_quota[1])["reason"]
        == f"behind workload {over_quota[0]} (same queue and request), which waits: {quota}"
    )
    assert h.get(no_gpu)["reason"] == "no node has 1 free GPU"


def test_replacing_a_queue_with_the_same_body_changes_nothing(make_harness: MakeHarness) -> None:
    """What ``tessera queues apply`` relies on to be idempotent: the row, creation time included, stays the same."""
    h = make_harness("1xA100-80GB")
    body = {"name": "lab", "tenant": "lab", "cohort": "c", "nominal": {"*": {"gpus": 1}}, "borrowing_limit": {}}
    first = h.http.post("/v1/queues", json=body, headers=h.as_(ADMIN)).json()
    created = h.server.ctx.store.queue("lab")
    assert created is not None
    h.clock.advance(60)
    again = h.http.post("/v1/queues", json=body, headers=h.as_(ADMIN)).json()
    assert again == first
    kept = h.server.ctx.store.queue("lab")
    assert kept is not None and kept.created_at == created.created_at


def test_a_record_keeps_the_command_and_an_array_task_its_index(make_harness: MakeHarness) -> None:
    h = make_harness("1xA100-80GB")
    first = h.submit(command=["python", "sweep.py"], array="0-1")["id"]
    records = {r["id"]: r for r in history(h)}
    assert records[first]["command"] == ["python", "sweep.py"] and records[first]["name"] == ""
    assert [records[first]["array_index"], records[first + 1]["array_index"]] == [0, 1]
    plain = h.submit(name="plain")["id"]
    assert {r["id"]: r for r in history(h)}[plain]["array_index"] is None
    assert name_of({"name": "", "command": ["python", "sweep.py"], "array_index": 1}) == "python sweep.py[1]"
    assert name_of({"name": "train", "command": ["python", "train.py"], "array_index": None}) == "train"
    assert name_of({"name": ""}) == "-"  # a server from before the command was recorded
