"""The per-workload GPU series and lifecycle counters of ``/metrics`` (issue 15, part 2): dcgm-exporter's label names,
base units, series that go when their workload ends, counters per queue, and none of it without an admin token."""

from __future__ import annotations

from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families
from server_harness import ADMIN, HOST, LOCKSTEP_S, FakeClock, Harness, MakeHarness

from tessera.server.store.store import Event

GIB = 1024**3


def _samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    return [
        (dict(s.labels), s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name
    ]


def _admin_metrics(h: Harness) -> str:
    response = h.http.get("/metrics", headers=h.as_(ADMIN))
    assert response.status_code == 200
    return response.text


def test_a_workload_has_its_share_and_memory_per_gpu_under_dcgm_labels_until_it_ends(make_harness: MakeHarness) -> None:
    h = make_harness("3xA100-80GB")
    wid = h.submit(gpus=2, name="train")["id"]
    other = h.submit(gpus=1, gpu_fraction=0.25, gpu_mem="10GiB")["id"]
    h.step()
    text = _admin_metrics(h)
    share = _samples(text, "tessera_workload_gpu_allocated_ratio")
    mine = [(labels, v) for labels, v in share if labels["workload"] == str(wid)]
    assert len(mine) == 2  # one series per GPU it holds
    for labels, value in mine:
        assert value == 1.0
        assert labels["workload_name"] == "train" and labels["queue"] == "default" and labels["tenant"] == "default"
        assert labels["UUID"].startswith("SIM-") and labels["simulated"] == "true"
        assert {"Hostname", "gpu", "modelName", "node"} <= labels.keys()
    assert len({labels["gpu"] for labels, _ in mine}) == 2
    memory = {
        (labels["workload"], labels["gpu"]): v
        for labels, v in _samples(text, "tessera_workload_gpu_allocated_memory_bytes")
    }
    gpu_of_other = next(labels["gpu"] for labels, _ in share if labels["workload"] == str(other))
    assert [v for (w, _), v in memory.items() if w == str(wid)] == [80 * GIB] * 2  # an 80 GiB (81920 MiB) A100
    assert memory[str(other), gpu_of_other] == 10 * GIB  # its --gpu-mem
    per_gpu = _samples(text, "tessera_gpu_allocated_memory_bytes")
    assert sum(v for _, v in per_gpu) == (1 + 1 + 0.25) * 80 * GIB
    assert all("UUID" in labels and "Hostname" in labels for labels, _ in per_gpu)  # joinable with DCGM's too

    h.backend.finish(str(wid), 0)
    h.step()
    after = _samples(_admin_metrics(h), "tessera_workload_gpu_allocated_ratio")
    assert {labels["workload"] for labels, _ in after} == {str(other)}  # the ended workload's series are gone


def test_lifecycle_counters_count_per_queue_across_the_settling_of_events(make_harness: MakeHarness) -> None:
    h = make_harness("1xA100-80GB")
    first = h.submit(gpus=1, gpu_fraction=0.5)["id"]
    second = h.submit(gpus=1, gpu_fraction=0.5)["id"]
    h.step()
    h.backend.finish(str(second), 3)  # a failure: exit code 3
    h.step()
    store = h.server.ctx.store
    store.update_workloads([], [Event(first, "preempted", "for the test")], h.clock())

    def counters() -> dict[str, float]:
        text = _admin_metrics(h)
        names = ("submissions", "starts", "preemptions", "failures")
        return {
            n: sum(v for labels, v in _samples(text, f"tessera_workload_{n}_total") if labels["queue"] == "default")
            for n in names
        }

    assert counters() == {"submissions": 2, "starts": 2, "preemptions": 1, "failures": 1}
    h.clock.advance(120)  # every event so far is settled: counted once, not again
    assert counters() == {"submissions": 2, "starts": 2, "preemptions": 1, "failures": 1}
    h.submit(gpus=1, gpu_fraction=0.5)
    h.step()
    assert counters() == {"submissions": 3, "starts": 3, "preemptions": 1, "failures": 1}


def test_without_an_admin_token_no_workload_queue_or_tenant_label_is_served(make_harness: MakeHarness) -> None:
    h = make_harness("1xA100-80GB")
    h.submit(gpus=1, gpu_fraction=0.5, name="secret-name")
    h.step()
    public = h.http.get("/metrics").text
    for label in ("workload", "workload_name", "queue", "tenant"):
        assert f'{label}="' not in public
    assert "secret-name" not in public
    assert _samples(public, "tessera_gpu_allocated_ratio")  # the per-GPU allocation stays public
    assert 'workload_name="secret-name"' in _admin_metrics(h)


def test_with_nvml_each_workload_process_reports_its_memory_and_utilisation(tmp_path: Path) -> None:
    from tessera.backends.fake import FakeBackend, fake_pid
    from tessera.gpu.fakes import FakeGpu, FakeNvml
    from tessera.gpu.nvml import NvmlProbe
    from tessera.server.loop_values import LoopConfig
    from tessera.server.up import UpConfig, build_server

    gpu = FakeGpu("NVIDIA A100-SXM4-80GB", 81920, "GPU-real-0")
    nvml = FakeNvml([gpu])
    nvml.nvmlInit()
    backend, clock = FakeBackend(), FakeClock()
    config = UpConfig(data_dir=tmp_path, loop=LoopConfig(run_dir=tmp_path, launch_wait_s=LOCKSTEP_S))
    server = build_server(config, probe=NvmlProbe(nvml), backend=backend, host=HOST, clock=clock)
    from tessera.api import WorkloadSpec
    from tessera.server.submit import Principal, workload_row

    store, loop = server.ctx.store, server.ctx.loop
    spec = WorkloadSpec(command=["x"], gpus=1, gpu_fraction=0.25)
    row = workload_row(spec, Principal(None, True), store.queues(), server.ctx.pool, clock())
    wid = store.add_workload(row, clock())
    loop.step()
    handle = loop.running[wid.id].handle
    assert handle is not None
    pid = fake_pid(handle)
    gpu.processes = [(pid, 3 * 1024), (999_999, 5 * 1024)]  # the second is no workload's: left out
    gpu.process_samples = [(pid, 10, 40), (pid, 20, 60), (999_999, 20, 90)]
    from prometheus_client import generate_latest

    text = generate_latest(server.ctx.metrics.registry).decode()
    used = _samples(text, "tessera_workload_process_gpu_memory_used_bytes")
    busy = _samples(text, "tessera_workload_process_gpu_utilization_ratio")
    assert [(labels["workload"], labels["pid"], labels["UUID"], v) for labels, v in used] == [
        (str(wid.id), str(pid), "GPU-real-0", 3 * GIB)
    ]
    assert [(labels["pid"], v) for labels, v in busy] == [(str(pid), 0.5)]  # the mean of its two samples
    again = generate_latest(server.ctx.metrics.registry).decode()
    assert not _samples(again, "tessera_workload_process_gpu_utilization_ratio")  # no new sample since
    assert "DCGM_FI_DEV_GPU_UTIL" in text  # the device series it joins with, from the same server


def test_a_simulated_pool_exports_no_process_series(make_harness: MakeHarness) -> None:
    h = make_harness("1xA100-80GB")
    h.submit(gpus=1, gpu_fraction=0.5)
    h.step()
    text = _admin_metrics(h)
    assert "tessera_workload_process_gpu_memory_used_bytes" not in text
    assert "DCGM_FI_DEV_GPU_UTIL" not in text
