"""Gangs, elastic jobs, job types and checkpointing through the API and the loop (in-process server, fake backend, a
clock moved by hand): a gang's launch carries its ranks, an elastic job grows into idle GPUs and gives workers back to
a higher priority (its ranks stopped and started again, the newcomer launched only once the old ranks exited), a
restarted server finishes a resize it had begun, and bad input is a 422 naming the field."""

from __future__ import annotations

from typing import Any

import pytest
from server_harness import ADMIN, Harness, MakeHarness

from tessera.backends.base import LaunchSpec
from tessera.backends.fake import FakeBackend

FOUR = "4xA100-80GB"


def _launches(h: Harness, workload_id: object) -> list[LaunchSpec]:
    return [spec for spec in h.backend.launched if spec.workload_id == str(workload_id)]


def _events(h: Harness, workload_id: object) -> list[dict[str, Any]]:
    response = h.http.get(f"/v1/workloads/{workload_id}/events", headers=h.as_(ADMIN))
    assert response.status_code == 200, response.text
    events: list[dict[str, Any]] = response.json()
    return events


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"workers": 0}, "workers"),
        ({"workers": 65}, "workers"),
        ({"workers": True}, "workers"),
        ({"elastic_min": 4, "elastic_max": 2}, "elastic_max"),
        ({"elastic_min": 2}, "elastic_min"),
        ({"elastic_max": 2}, "elastic_max"),
        ({"elastic_min": 0, "elastic_max": 2}, "elastic_min"),
        ({"workers": 5, "elastic_min": 1, "elastic_max": 4}, "workers"),
        ({"job_type": "GPT-17"}, "job_type"),
        ({"workers": 5, "gpus": 1}, "workers"),  # a gang larger than the pool (4 GPUs)
        ({"workers": 3, "gpus": 2}, "workers"),
        ({"elastic_min": 5, "elastic_max": 8, "gpus": 1}, "workers"),  # even its minimum never fits
        ({"workers": 2, "kind": "service"}, "workers"),
        ({"checkpointable": "yes"}, "checkpointable"),
    ],
)
def test_bad_job_shapes_are_422_naming_the_field(
    make_harness: MakeHarness, body: dict[str, object], field: str
) -> None:
    h = make_harness(FOUR)
    response = h.http.post("/v1/workloads", json={"command": ["true"], **body}, headers=h.as_(ADMIN))
    assert response.status_code == 422, response.text
    assert response.json()["field"] == field, response.text


def test_an_unknown_job_type_lists_the_known_ones_and_a_known_one_is_matched_without_case(
    make_harness: MakeHarness,
) -> None:
    h = make_harness(FOUR)
    response = h.http.post("/v1/workloads", json={"command": ["true"], "job_type": "gpt"}, headers=h.as_(ADMIN))
    assert "ResNet-50" in response.json()["detail"]
    assert h.submit(job_type="resnet-50", gpus=1)["job_type"] == "ResNet-50"
    config = h.http.get("/v1/config", headers=h.as_(ADMIN)).json()
    assert "ResNet-50" in config["job_types"]


def test_a_gang_is_placed_whole_and_launched_once_with_its_ranks(make_harness: MakeHarness) -> None:
    h = make_harness(FOUR)
    gang = h.submit(workers=3, gpus=1, cpu=1, mem="1GiB")
    too_big_now = h.submit(workers=2, gpus=1)  # one GPU is left: all or nothing, so it waits
    h.step()
    (spec,) = _launches(h, gang["id"])
    assert spec.gang is not None and (spec.gang.world_size, spec.gang.ranks) == (3, (0, 1, 2))
    assert len(spec.gpus) == 3 and spec.cpu_milli == 3000 and spec.mem_max_mib == 3072
    assert spec.env["TESSERA_RESTARTS"] == "0"
    assert h.get(gang["id"])["workers"] == 3 and len(h.get(gang["id"])["placement"]) == 3
    assert h.get(too_big_now["id"])["state"] == "pending" and not _launches(h, too_big_now["id"])
    single = h.submit(gpus=1)
    h.step()
    assert _launches(h, single["id"])[0].gang is None  # one worker: the command itself, no ranks


def test_an_elastic_job_grows_shrinks_for_a_higher_priority_and_grows_back(make_harness: MakeHarness) -> None:
    """The acceptance scenario on the fake backend: elastic 1-4 on 4 GPUs grows to 4; a higher-priority 2-GPU job
    takes 2 (the elastic job's ranks are stopped and started again on 2; the newcomer starts only once the old ranks
    have exited); when it ends, the elastic job grows back to 4."""
    h = make_harness(FOUR)
    elastic = h.submit(gpus=1, elastic_min=1, elastic_max=4, priority="best-effort", checkpointable=True)
    wid = str(elastic["id"])
    h.step()
    assert h.get(wid)["workers"] == 4 and h.get(wid)["workers_asked"] == 1
    (first,) = _launches(h, wid)
    assert first.gang is not None and first.gang.world_size == 4  # bound and grown in one instant: one launch

    urgent = h.submit(workers=2, gpus=1, priority="training")
    h.step()  # the shrink is decided: the elastic job's ranks are told to stop; the urgent job waits for them
    assert h.get(wid)["workers"] == 2
    assert (wid, 10.0) in h.backend.stops
    assert not _launches(h, urgent["id"])
    h.step()  # the old ranks have exited: the elastic job restarts on 2 workers, the urgent job starts
    second = _launches(h, wid)[-1]
    assert second.gang is not None and second.gang.world_size == 2 and second.env["TESSERA_RESTARTS"] == "1"
    assert len(_launches(h, urgent["id"])) == 1
    assert h.get(wid)["state"] == "running" and h.get(wid)["attempts"] == 2
    kinds = [e["kind"] for e in _events(h, wid)]
    assert "shrunk" in kinds and "restarted" in kinds

    h.backend.finish(str(urgent["id"]), 0)
    h.step()  # the urgent job ended: the elastic job grows into its GPUs again
    h.step()
    assert h.get(wid)["workers"] == 4
    third = _launches(h, wid)[-1]
    assert third.gang is not None and third.gang.world_size == 4
    assert "grown" in [e["kind"] for e in _events(h, wid)]
    assert h.get(wid)["state"] == "running"


def test_a_rigid_job_and_a_preset_without_elastic_jobs_never_resize(make_harness: MakeHarness) -> None:
    h = make_harness(FOUR, policy="fifo-share")  # runs elastic jobs as rigid gangs, as in the twin
    elastic = h.submit(gpus=1, elastic_min=1, elastic_max=4)
    h.step()
    h.step()
    assert h.get(elastic["id"])["workers"] == 1 and len(_launches(h, elastic["id"])) == 1


def test_a_restarted_server_finishes_a_resize_it_had_begun(make_harness: MakeHarness, tmp_path: Any) -> None:
    """The server dies after storing a shrink, before the old ranks exited: the new one stops them again and, once
    they have exited, launches the job on the workers stored, never on the old ones."""
    backend = FakeBackend()
    h = make_harness(FOUR, backend=backend)
    elastic = h.submit(gpus=1, elastic_min=1, elastic_max=4, priority="best-effort", checkpointable=True)
    wid = str(elastic["id"])
    h.step()
    assert h.get(wid)["workers"] == 4
    urgent = h.submit(workers=2, gpus=1, priority="training")
    stops: list[str] = []
    backend.stop = lambda workload_id, grace_s: stops.append(workload_id)  # type: ignore[method-assign]  # slow ranks
    h.step()
    shrunk = h.get(wid)["workers"]
    assert shrunk < 4 and stops == [wid] and not _launches(h, urgent["id"])
    backend.close()  # the server is killed here, the old ranks still stopping

    restarted = make_harness(FOUR, db_url=h.db_url, backend=backend)
    assert stops == [wid, wid]  # recovery sent the stored stop again
    restarted.step()
    # Which victims the urgent job waited for was not stored: it still waits for the old ranks to exit.
    assert not _launches(restarted, urgent["id"]) and len(_launches(restarted, wid)) == 1
    backend.finish(wid, -15)  # the old ranks exit
    restarted.step()
    assert len(_launches(restarted, urgent["id"])) == 1
    last = _launches(restarted, wid)[-1]
    assert (last.gang.world_size if last.gang is not None else 1) == shrunk == restarted.get(wid)["workers"]
    assert len(_launches(restarted, wid)) == 2 and restarted.get(wid)["state"] == "running"


def test_a_gang_across_hosts_is_one_launch_with_a_part_per_host(make_harness: MakeHarness) -> None:
    """Two hosts of 2 GPUs, a gang of 3: rank 0's host runs ranks 0-1 in the launch itself, the other host's rank
    2 is a part of it (``LaunchSpec.gang_parts``), with its own GPU and limits."""
    h = make_harness(hosts={"n1": "2xA100-80GB", "n2": "2xA100-80GB"}, policy="fifo-share")
    gang = h.submit(workers=3, gpus=1, cpu=1, mem="1GiB")
    h.step()
    (spec,) = _launches(h, gang["id"])
    assert spec.gang is not None and (spec.gang.world_size, spec.gang.ranks) == (3, (0, 1))
    assert len(spec.gpus) == 2 and spec.cpu_milli == 2000 and spec.mem_max_mib == 2048
    (part,) = spec.gang_parts
    assert part.node != spec.node and part.ranks == (2,) and len(part.gpus) == 1
    assert (part.cpu_milli, part.mem_max_mib) == (1000, 1024)
    assert {g.uuid for g in part.gpus}.isdisjoint(g.uuid for g in spec.gpus)


def test_checkpointable_defaults_to_the_priority_class_and_false_keeps_preemption_off(
    make_harness: MakeHarness,
) -> None:
    """A workload of a preemptible class is taken to resume from its checkpoints unless it says it cannot; one that
    cannot is never preempted under tessera (restarting it from zero would lose its work), not even by an
    inference-critical one, which waits instead."""
    h = make_harness("1xA100-80GB")
    assert h.submit(priority="training")["checkpointable"] is True
    assert h.submit(priority="inference-critical")["checkpointable"] is False
    for w in h.server.ctx.store.workloads_in(["pending"]):
        h.http.post(f"/v1/workloads/{w.id}/cancel", headers=h.as_(ADMIN))
    h.step()
    fragile = h.submit(gpus=1, priority="training", checkpointable=False)
    h.step()
    urgent = h.submit(gpus=1, priority="inference-critical")
    h.step()
    h.step()
    assert h.get(fragile["id"])["state"] == "running" and not h.backend.stops
    assert h.get(urgent["id"])["state"] == "pending"


def test_a_resized_run_is_accounted_on_each_of_its_placements(make_harness: MakeHarness) -> None:
    """``tessera history``: an elastic job on 4 GPUs for 100 s, then on 2 for 50 s, used 500 GPU-seconds (not its
    last placement times its whole run), and its CPU likewise."""
    h = make_harness(FOUR)
    elastic = h.submit(gpus=1, cpu=1, elastic_min=1, elastic_max=4, priority="best-effort", checkpointable=True)
    wid = str(elastic["id"])
    h.step()
    assert h.get(wid)["workers"] == 4
    h.clock.advance(100)
    urgent = h.submit(workers=2, gpus=1, priority="training", command=["sleep", "600"])
    h.step()
    h.step()
    assert h.get(wid)["workers"] == 2 and h.get(urgent["id"])["state"] == "running"
    h.clock.advance(50)
    h.backend.finish(wid, 0)
    h.step()
    (record,) = [r for r in h.http.get("/v1/history", headers=h.as_(ADMIN)).json() if str(r["id"]) == wid]
    assert record["state"] == "succeeded" and record["elapsed_s"] == pytest.approx(150)
    assert record["gpu_hours"] == pytest.approx(500 / 3600, abs=1e-6)
    assert record["cpu_hours"] == pytest.approx(500 / 3600, abs=1e-6)


def test_a_cancel_during_a_resize_ends_the_job_and_relaunches_nothing(make_harness: MakeHarness) -> None:
    backend = FakeBackend()
    h = make_harness(FOUR, backend=backend)
    elastic = h.submit(gpus=1, elastic_min=1, elastic_max=4, priority="best-effort", checkpointable=True)
    wid = str(elastic["id"])
    h.step()
    urgent = h.submit(workers=2, gpus=1, priority="training")
    stops: list[str] = []
    backend.stop = lambda workload_id, grace_s: stops.append(workload_id)  # type: ignore[method-assign]  # slow ranks
    h.step()  # the shrink is stored and its stop sent; the old ranks are still stopping
    assert h.http.post(f"/v1/workloads/{wid}/cancel", headers=h.as_(ADMIN)).status_code == 200
    h.step()
    backend.finish(wid, -15)  # the old ranks exit
    h.step()
    h.step()
    assert h.get(wid)["state"] == "cancelled" and len(_launches(h, wid)) == 1  # never started again
    assert h.get(urgent["id"])["state"] == "running" and len(_launches(h, urgent["id"])) == 1
