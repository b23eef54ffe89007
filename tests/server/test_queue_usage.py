"""Each queue's GPU usage over time: the server's sampler (``server.usage_history``) and ``GET /v1/queues/usage``
(in-process server, fake backend, a clock moved by hand). A sample is taken on a change and at least every period;
changes closer than a second fold into one; the window and the cap bound what is kept; a tenant sees only its own
queues; a bad query parameter is a 422 naming it."""

from __future__ import annotations

from typing import Any

import pytest
from server_harness import ADMIN, Harness, MakeHarness

from tessera.core.queueing import QueueSpec, ResourceVector
from tessera.server.usage_history import UsageHistory

PERIOD = 15.0


def usage(h: Harness, token: str = ADMIN, **params: Any) -> dict[str, Any]:
    response = h.http.get("/v1/queues/usage", params=params, headers=h.as_(token))
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


def points(answer: dict[str, Any], queue: str) -> list[tuple[float, int, int, int | None]]:
    (found,) = [q for q in answer["queues"] if q["queue"] == queue]
    return [(p["at"], p["gpu_milli"], p["borrowed_milli"], p["nominal_milli"]) for p in found["points"]]


def lab(h: Harness) -> dict[str, str]:
    """team-a (a quarter GPU) and team-b (half a GPU) in one cohort, and a token for each."""
    tokens = {}
    for tenant, gpus in (("team-a", 0.25), ("team-b", 0.5)):
        queue = {"name": tenant, "tenant": tenant, "cohort": "lab", "nominal": {"*": {"gpus": gpus}}}
        assert h.http.post("/v1/queues", json=queue, headers=h.as_(ADMIN)).status_code == 201
        created = h.http.post("/v1/tokens", json={"tenant": tenant}, headers=h.as_(ADMIN))
        tokens[tenant] = str(created.json()["token"])
    return tokens


def test_usage_is_sampled_on_change_and_each_period_and_a_tenant_sees_its_own(make_harness: MakeHarness) -> None:
    h = make_harness("1xA100-80GB")
    tokens = lab(h)
    t0 = h.clock()
    h.step()
    h.clock.advance(5)
    h.submit(tokens["team-a"], gpus=1, gpu_fraction=0.5)  # over its quarter: borrows a quarter from team-b
    h.step()
    h.clock.advance(5)
    h.step()  # no change, and the period has not passed: no sample
    h.clock.advance(PERIOD)
    h.step()
    everything = usage(h)
    assert everything["now"] == t0 + 25 and everything["period_s"] == PERIOD
    assert {q["queue"] for q in everything["queues"]} == {"default", "team-a", "team-b"}
    assert points(everything, "team-a") == [(t0, 0, 0, 250), (t0 + 5, 500, 250, 250), (t0 + 25, 500, 250, 250)]
    assert points(everything, "team-b")[-1] == (t0 + 25, 0, 0, 500)
    assert points(everything, "default")[-1][3] is None  # no GPU quota: the whole pool

    mine = usage(h, tokens["team-a"])
    assert [q["queue"] for q in mine["queues"]] == ["team-a"] and mine["queues"][0]["tenant"] == "team-a"
    assert points(mine, "team-a") == points(everything, "team-a")
    assert usage(h, tokens["team-a"], queue="team-b")["queues"] == []  # another tenant's: as if it did not exist
    assert usage(h, queue="nope")["queues"] == []
    assert [q["queue"] for q in usage(h, queue="team-b")["queues"]] == ["team-b"]  # the admin narrows to one

    assert points(usage(h, window_s=10), "team-a") == [(t0 + 25, 500, 250, 250)]
    assert points(usage(h, limit=2), "team-a") == points(everything, "team-a")[-2:]
    assert h.http.get("/v1/queues/usage").status_code == 401


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"window_s": 0}, "window_s"),
        ({"window_s": "an hour"}, "window_s"),
        ({"window_s": 10 * 24 * 3600}, "window_s"),
        ({"limit": 0}, "limit"),
        ({"limit": 10**6}, "limit"),
        ({"queue": ""}, "queue"),
    ],
)
def test_a_bad_query_parameter_is_refused_naming_it(
    make_harness: MakeHarness, params: dict[str, Any], field: str
) -> None:
    h = make_harness("1xA100-80GB")
    response = h.http.get("/v1/queues/usage", params=params, headers=h.as_(ADMIN))
    assert response.status_code == 422, response.text
    assert response.json()["field"] == field and response.json()["detail"].startswith(f"{field}: ")


def test_the_window_and_the_cap_bound_what_the_server_keeps(make_harness: MakeHarness) -> None:
    h = make_harness("1xA100-80GB")
    h.server.ctx.usage = UsageHistory(period_s=5, window_s=100, max_points=1000)
    for _ in range(60):  # 300 s, a sample every 5 s
        h.step()
        h.clock.advance(5)
    kept = points(usage(h), "default")
    assert len(kept) == 21 and kept[0][0] == h.clock() - 5 - 100  # the last 100 s, both ends included
    h.server.ctx.usage = UsageHistory(period_s=5, window_s=100, max_points=8)
    for _ in range(20):
        h.step()
        h.clock.advance(5)
    assert len(points(usage(h), "default")) == 8


def spec(name: str, gpu_milli: int) -> QueueSpec:
    return QueueSpec(name, nominal={"*": ResourceVector(gpu_milli, 10**6, 10**6)})


def test_changes_within_a_second_fold_into_one_sample_and_a_deleted_queue_loses_its_history() -> None:
    history = UsageHistory(period_s=PERIOD, coalesce_s=1.0)
    queues = [spec("a", 1000), spec("b", 500)]

    def at(t: float, a: int, b: int = 0) -> None:
        history.observe(t, queues, {"a": {"*": (a, 0, 0)}, "b": {"*": (b, 0, 0)}})

    at(0, 0)
    at(10, 250)
    at(10.3, 500)  # within a second of the last change: replaces it
    at(10.6, 250, 800)  # b borrows 300 over its 500
    at(10.9, 250)  # b's blip folds away: back to what it was before
    got = history.read(["a", "b"])
    assert [(s.at, s.gpu_milli) for s in got["a"]] == [(0, 0), (10, 250)]
    assert [(s.at, s.gpu_milli, s.borrowed_milli) for s in got["b"]] == [(0, 0, 0)]
    at(12, 250, 800)
    assert history.read(["b"])["b"][-1].borrowed_milli == 300
    queues = [spec("a", 1000)]
    at(13, 250)
    assert history.read(["a", "b"])["b"] == []
