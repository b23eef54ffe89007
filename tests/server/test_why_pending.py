"""What a new user tripped on in the API (issue 25, defect 9): a workload queued behind a quota-blocked one says what
it waits for (it said "waiting for the next scheduling step" until capacity was released); GPU types with gpus 0
are refused naming ``gpu_types`` (they gave a CPU-only workload); NaN and infinity are 422 naming the field, in
bodies and in query parameters."""

from __future__ import annotations

import pytest
from server_harness import ADMIN, MakeHarness

AS_ADMIN = {"Authorization": f"Bearer {ADMIN}"}


def test_a_workload_behind_a_quota_blocked_one_says_what_it_waits_for(make_harness: MakeHarness) -> None:
    h = make_harness("2xA100-80GB")
    queue = {"name": "a", "tenant": "a", "nominal": {"*": {"gpus": 1}}}
    assert h.http.post("/v1/queues", json=queue, headers=AS_ADMIN).status_code == 201
    running = h.submit(queue="a", gpus=1)["id"]
    h.step()
    blocked = h.submit(queue="a", gpus=1)["id"]
    h.step()
    behind = h.submit(queue="a", gpus=1)["id"]  # same shape: no step is offered it before capacity is released
    h.step()
    assert h.get(running)["state"] == "running"
    assert h.get(blocked)["reason"] == "queue a has no quota left for 1 GPU"
    assert h.get(behind)["reason"] == (
        f"behind workload {blocked} (same queue and request), which waits: queue a has no quota left for 1 GPU"
    )
    h.backend.finish(str(running), 0)
    h.step()
    assert h.get(blocked)["state"] == "running"
    assert h.get(behind)["reason"] == "queue a has no quota left for 1 GPU"  # now the first in line


def test_gpu_types_without_gpus_are_refused_naming_the_field(make_harness: MakeHarness) -> None:
    h = make_harness()
    answer = h.http.post("/v1/workloads", json={"command": ["true"], "gpu_types": ["A100-80GB"]}, headers=AS_ADMIN)
    assert answer.status_code == 422 and answer.json()["field"] == "gpu_types", answer.text
    assert h.submit(gpus=1, gpu_types=["A100-80GB"])["gpus"] == 1


@pytest.mark.parametrize(
    ("method", "path", "body", "field"),
    [
        ("POST", "/v1/workloads", '{"command": ["true"], "gpus": 1, "gpu_fraction": NaN}', "gpu_fraction"),
        ("POST", "/v1/workloads", '{"command": ["true"], "gpus": 1, "gpu_fraction": Infinity}', "gpu_fraction"),
        ("POST", "/v1/workloads", '{"command": ["true"], "time_limit": Infinity}', "time_limit"),
        ("POST", "/v1/queues", '{"name": "q", "tenant": "q", "weight": NaN}', "weight"),
        ("POST", "/v1/queues", '{"name": "q", "tenant": "q", "nominal": {"*": {"gpus": Infinity}}}', "nominal.*.gpus"),
        ("POST", "/v1/models", '{"name": "m", "gpu_fraction": NaN}', "gpu_fraction"),
        ("POST", "/v1/models", '{"name": "m", "idle_timeout": -Infinity}', "idle_timeout"),
        ("GET", "/v1/history?since=inf", "", "since"),
        ("GET", "/v1/history/totals?until=nan", "", "until"),
        ("GET", "/v1/queues/usage?window_s=inf", "", "window_s"),
    ],
)
def test_nan_and_infinity_are_422_naming_the_field(
    make_harness: MakeHarness, method: str, path: str, body: str, field: str
) -> None:
    h = make_harness()
    headers = {**AS_ADMIN, "Content-Type": "application/json"}
    answer = h.http.request(method, path, content=body or None, headers=headers)
    assert answer.status_code == 422, answer.text
    assert answer.json()["field"] == field and "finite" in answer.json()["detail"]
