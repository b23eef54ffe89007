"""The job options through the API and the loop (in-process server, fake backend, a clock moved by hand): working
directory and unbuffered Python, walltime, job arrays with their index and ``%N`` limit, dependencies (waiting with
a reason that names them, ended when they can never be met), hold and release, and bad input as 422 naming the
field."""

from __future__ import annotations

from typing import Any

import pytest
from server_harness import ADMIN, Harness, MakeHarness


def _launched(h: Harness) -> dict[str, Any]:
    return {spec.workload_id: spec for spec in h.backend.launched}


def _list(h: Harness, **params: str | int) -> list[dict[str, Any]]:
    response = h.http.get("/v1/workloads", params=params, headers=h.as_(ADMIN))
    assert response.status_code == 200, response.text
    result: list[dict[str, Any]] = response.json()
    return result


def test_a_workload_runs_in_its_directory_with_unbuffered_python(make_harness: MakeHarness) -> None:
    h = make_harness()
    here = h.submit(cwd="/srv/project")
    unset = h.submit()
    buffered = h.submit(env={"PYTHONUNBUFFERED": ""})  # the user's own value wins
    h.step()
    specs = _launched(h)
    assert str(specs[str(here["id"])].workdir) == "/srv/project" and here["cwd"] == "/srv/project"
    assert specs[str(unset["id"])].workdir is None  # the SDK sent none: the account's home or the server's dir
    assert specs[str(here["id"])].env["PYTHONUNBUFFERED"] == "1"
    assert specs[str(buffered["id"])].env["PYTHONUNBUFFERED"] == ""


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"cwd": "relative/dir"}, "cwd"),
        ({"cwd": "/a\x00b"}, "cwd"),
        ({"time_limit": "2 hours"}, "time_limit"),
        ({"time_limit": 0}, "time_limit"),
        ({"time_limit": "1:75:00"}, "time_limit"),
        ({"array": "9-0"}, "array"),
        ({"array": "0-5000"}, "array"),
        ({"array": "0-3%0"}, "array"),
        ({"dependency": "after:1"}, "dependency"),
        ({"dependency": "afterok:"}, "dependency"),
        ({"dependency": "afterok:999"}, "dependency"),  # no such workload
        ({"hold": "yes"}, "hold"),
    ],
)
def test_bad_job_options_are_422_naming_the_field(
    make_harness: MakeHarness, body: dict[str, object], field: str
) -> None:
    h = make_harness()
    response = h.http.post("/v1/workloads", json={"command": ["true"], **body}, headers=h.as_(ADMIN))
    assert response.status_code == 422, response.text
    assert response.json()["field"] == field, response.json()


def test_walltime_stops_the_workload_and_it_fails_saying_so(make_harness: MakeHarness) -> None:
    h = make_harness()
    w = h.submit(command=["sleep", "1000"], time_limit="2m")
    assert w["time_limit_s"] == 120
    h.step()
    h.clock.advance(119)
    h.step()
    assert h.backend.stops == [] and h.get(w["id"])["state"] == "running"
    h.clock.advance(1)
    h.step()  # SIGTERM, grace, SIGKILL: the fake ends it at once
    assert h.backend.stops == [(str(w["id"]), 10.0)]
    h.step()
    ended = h.get(w["id"])
    assert ended["state"] == "failed" and ended["reason"] == "walltime 2m exceeded", ended
    events = h.http.get(f"/v1/workloads/{w['id']}/events", headers=h.as_(ADMIN)).json()
    assert "timeout" in [e["kind"] for e in events]


def test_an_array_makes_one_workload_per_index_with_its_index_in_the_environment(make_harness: MakeHarness) -> None:
    h = make_harness("2xA100-80GB")
    first = h.submit(gpus=1, array="0-8:4", name="sweep")
    tasks = _list(h, array=first["id"])
    assert [t["array_index"] for t in tasks] == [0, 4, 8]
    assert {t["array_id"] for t in tasks} == {first["id"]} and tasks[0]["id"] == first["id"]
    h.step()
    specs = _launched(h)
    running = [t for t in tasks if str(t["id"]) in specs]
    assert len(running) == 2  # two GPUs
    for task in running:
        env = specs[str(task["id"])].env
        assert env["TESSERA_ARRAY_INDEX"] == env["SLURM_ARRAY_TASK_ID"] == str(task["array_index"])
        assert env["TESSERA_ARRAY_ID"] == env["SLURM_ARRAY_JOB_ID"] == str(first["id"])
    assert [t["id"] for t in _list(h, name="sweep")] == [t["id"] for t in tasks]


def test_an_array_limit_runs_at_most_n_tasks_at_once(make_harness: MakeHarness) -> None:
    h = make_harness("4xA100-80GB")
    first = h.submit(gpus=1, array="1,3,5%2")
    ids = [t["id"] for t in _list(h, array=first["id"])]
    h.step()
    states = [h.get(i)["state"] for i in ids]
    assert states == ["running", "running", "pending"]  # room for all three, the limit allows two
    h.step()
    assert h.get(ids[2])["reason"] == f"array {first['id']}: at most 2 of its tasks run at once (%2)"
    h.backend.finish(str(ids[0]), 0)
    h.step()
    h.step()
    assert h.get(ids[2])["state"] == "running"


def test_afterok_waits_naming_the_dependency_then_runs(make_harness: MakeHarness) -> None:
    h = make_harness("2xA100-80GB")
    a = h.submit(gpus=1, command=["sleep", "10"])
    b = h.submit(gpus=1, dependency=f"afterok:{a['id']}")
    h.step()
    h.step()  # the reason is the gate's, as of the start of a step
    waiting = h.get(b["id"])
    assert waiting["state"] == "pending" and waiting["dependency"] == f"afterok:{a['id']}"
    assert waiting["reason"] == f"waiting for dependency afterok:{a['id']}: workload {a['id']} (running)"
    h.backend.finish(str(a["id"]), 0)
    h.step()
    h.step()
    assert h.get(b["id"])["state"] == "running"


@pytest.mark.parametrize(
    ("kind", "exit_code", "runs"),
    [("afterok", 1, False), ("afternotok", 0, False), ("afternotok", 3, True), ("afterany", 3, True)],
)
def test_a_dependency_is_met_or_ends_its_workload_with_a_reason(
    make_harness: MakeHarness, kind: str, exit_code: int, runs: bool
) -> None:
    h = make_harness()
    a = h.submit(command=["train"])
    b = h.submit(dependency=f"{kind}:{a['id']}")
    h.step()
    h.backend.finish(str(a["id"]), exit_code)
    h.step()
    h.step()
    after = h.get(b["id"])
    if runs:
        assert after["state"] in ("running", "succeeded"), after
    else:
        state = "failed" if exit_code else "succeeded"
        assert after["state"] == "cancelled", after
        assert after["reason"] == f"dependency {kind}:{a['id']} can never be satisfied: workload {a['id']} {state}"


def test_a_dependency_on_an_array_waits_for_all_its_tasks(make_harness: MakeHarness) -> None:
    h = make_harness("2xA100-80GB")
    first = h.submit(gpus=1, array="0-1")
    ids = [t["id"] for t in _list(h, array=first["id"])]
    after = h.submit(dependency=f"afterany:{first['id']}")
    assert after["dependency"] == "afterany:" + ":".join(map(str, ids))


def test_a_tenant_cannot_depend_on_another_tenants_workload(make_harness: MakeHarness) -> None:
    h = make_harness()
    other = h.submit()
    token = h.http.post("/v1/tokens", json={"tenant": "team-a"}, headers=h.as_(ADMIN)).json()["token"]
    body = {"command": ["true"], "dependency": f"afterok:{other['id']}"}
    response = h.http.post("/v1/workloads", json=body, headers=h.as_(token))
    assert response.status_code == 422 and response.json()["field"] == "dependency"
    assert response.json()["detail"] == f"dependency: no workload {other['id']}"


def test_hold_and_release(make_harness: MakeHarness) -> None:
    h = make_harness()
    held = h.submit(hold=True)
    later = h.submit(command=["sleep", "100"])
    assert held["held"] and held["reason"] == "held"
    h.step()
    assert h.get(held["id"])["state"] == "pending" and h.get(later["id"])["state"] == "running"
    assert h.get(held["id"])["reason"].startswith("held")
    conflict = h.http.post(f"/v1/workloads/{later['id']}/hold", headers=h.as_(ADMIN))
    assert conflict.status_code == 409 and "running" in conflict.json()["detail"]
    released = h.http.post(f"/v1/workloads/{held['id']}/release", headers=h.as_(ADMIN)).json()
    assert not released["held"]
    h.step()
    assert h.get(held["id"])["state"] == "running"


def test_a_workload_held_while_it_waits_is_taken_out_of_the_offer(make_harness: MakeHarness) -> None:
    h = make_harness()
    blocker = h.submit(gpus=1, command=["sleep", "100"])
    w = h.submit(gpus=1)
    h.step()
    assert h.get(w["id"])["state"] == "pending"
    assert h.http.post(f"/v1/workloads/{w['id']}/hold", headers=h.as_(ADMIN)).json()["held"]
    h.backend.finish(str(blocker["id"]), 0)
    h.step()
    h.step()
    shown = h.get(w["id"])
    assert shown["state"] == "pending" and shown["reason"].startswith("held"), shown
    assert h.http.post("/v1/workloads/999/hold", headers=h.as_(ADMIN)).status_code == 404


def test_hold_dependency_and_array_limit_on_postgresql(make_harness: MakeHarness, postgres_url: str) -> None:
    h = make_harness("4xA100-80GB", db_url=postgres_url)
    a = h.submit(gpus=1, command=["train"])
    held = h.submit(gpus=1, hold=True)
    first = h.submit(gpus=1, array="0-2%1", dependency=f"afterok:{a['id']}")
    tasks = [t["id"] for t in _list(h, array=first["id"])]
    h.step()
    assert [h.get(i)["state"] for i in (a["id"], held["id"], *tasks)] == ["running"] + ["pending"] * 4
    h.backend.finish(str(a["id"]), 0)
    h.step()
    h.step()
    assert [h.get(i)["state"] for i in tasks] == ["running", "pending", "pending"]
    assert h.get(held["id"])["reason"].startswith("held")
