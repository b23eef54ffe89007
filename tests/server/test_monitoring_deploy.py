"""The monitoring files shipped in deploy/ (issue 15, part 2): the alert rules pass ``promtool check rules`` and their
unit tests, the dashboard's queries are valid PromQL, every metric the dashboard and the rules name is one a running
server exports, and ``make run PROMETHEUS=1``'s script starts a Prometheus that scrapes the demo with the admin token.

promtool and prometheus come from Debian's ``prometheus`` package (scripts/test-packages.sh installs it); without
them these tests skip and say so."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from live_server import free_port
from prometheus_client.parser import text_string_to_metric_families
from server_harness import ADMIN, HOST, LOCKSTEP_S, FakeClock

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
DASHBOARD = DEPLOY / "grafana" / "tessera.json"
RULES = DEPLOY / "prometheus" / "alerts.yml"
RUN_LOCAL = DEPLOY / "prometheus" / "run-local.sh"
# Series Prometheus makes itself, not an exporter.
PROMETHEUS_OWN = frozenset({"up"})
# Grafana's variables, as a query sees them once Grafana has put their values in.
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$queue": ".*", "$served_model": ".*"}

needs_promtool = pytest.mark.skipif(
    shutil.which("promtool") is None, reason="promtool missing (Debian package prometheus; scripts/test-packages.sh)"
)

# PromQL words that are not metric names: functions are followed by "(" and are dropped by the parser below.
_KEYWORDS = frozenset(
    [
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
        "bool",
        "and",
        "or",
        "unless",
        "offset",
        "inf",
        "nan",
        "sum",
        "min",
        "max",
        "avg",
        "count",
        "stddev",
        "stdvar",
        "topk",
        "bottomk",
        "quantile",
        "count_values",
        "group",
    ]
)


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads: strings, label matchers, ranges, grouping clauses and function
    calls taken out, the identifiers left are metric names."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # strings
    text = re.sub(r"\{[^}]*\}", " ", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", " ", text)  # ranges and subqueries
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)  # label lists
    names = set()
    for match in re.finditer(r"[a-zA-Z_:][a-zA-Z0-9_:]*", text):
        following = text[match.end() :].lstrip()
        word = match.group()
        if following.startswith("(") or word in _KEYWORDS or re.fullmatch(r"\d.*", word):
            continue
        if match.start() > 0 and (text[match.start() - 1].isdigit() or text[match.start() - 1] == "."):
            continue  # the exponent or unit of a number (1e3)
        names.add(word)
    return names


def test_the_promql_name_parser_finds_names_and_only_names() -> None:
    expr = (
        'histogram_quantile(0.95, sum by (le, queue) (rate(tessera_workload_pending_seconds_bucket{queue=~"a|b"}[5m])))'
        " > on (UUID) group_left max by (UUID) (DCGM_FI_DEV_GPU_UTIL) or vector(1e3) unless up == bool 0"
    )
    assert metric_names(expr) == {"tessera_workload_pending_seconds_bucket", "DCGM_FI_DEV_GPU_UTIL", "up"}


def dashboard_queries() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    queries = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    queries += [v["definition"] for v in dashboard["templating"]["list"] if v.get("type") == "query"]
    return queries


def rule_queries() -> list[str]:
    rules = yaml.safe_load(RULES.read_text())
    return [str(rule["expr"]) for group in rules["groups"] for rule in group["rules"]]


def _grafana_to_promql(query: str) -> str:
    for variable, value in GRAFANA_VARIABLES.items():
        query = query.replace(variable, value)
    labels = re.fullmatch(r"label_values\((\w+), \w+\)", query)  # a variable's query: the metric it reads
    return labels.group(1) if labels else query


def test_the_dashboard_is_grafana_json_with_unique_panels_that_do_not_overlap() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] == "tessera-overview" and dashboard["schemaVersion"] >= 36
    panels = dashboard["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    cells: set[tuple[int, int]] = set()
    for p in panels:
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24, p["title"]
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not cells & mine, f"panel {p['title']!r} overlaps another"
        cells |= mine
        for target in p.get("targets", []):
            assert target["expr"] and target["datasource"]["uid"] == "${datasource}", p["title"]
    assert len(dashboard_queries()) >= 15


@needs_promtool
def test_promtool_checks_the_shipped_alert_rules() -> None:
    done = subprocess.run(["promtool", "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(rule_queries())} rules found" in done.stdout


@needs_promtool
def test_the_alert_rules_unit_tests_pass() -> None:
    tests = RULES.parent / "alerts_test.yml"
    done = subprocess.run(["promtool", "test", "rules", str(tests)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


@needs_promtool
def test_every_dashboard_query_is_valid_promql(tmp_path: Path) -> None:
    """promtool parses them as recording rules: a syntax error, an unknown function or a wrong type fails."""
    records = [
        {"record": f"tessera:dashboard_query_{i}", "expr": _grafana_to_promql(q)}
        for i, q in enumerate(dashboard_queries())
    ]
    path = tmp_path / "dashboard_rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": records}]}))
    done = subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


@needs_promtool
def test_the_local_prometheus_configuration_is_valid(tmp_path: Path) -> None:
    done = subprocess.run(
        ["bash", str(RUN_LOCAL), "unused", "8470", "9090", str(tmp_path), "--config-only"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    config = tmp_path / "prometheus" / "prometheus.yml"
    token = tmp_path / "prometheus" / "admin-token"
    assert token.stat().st_mode & 0o077 == 0  # the admin token is the owner's only
    scrape = yaml.safe_load(config.read_text())["scrape_configs"][0]
    assert scrape["authorization"]["credentials_file"] == str(token.resolve())
    checked = subprocess.run(["promtool", "check", "config", str(config)], capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def _exported_by_a_server_with_nvml(tmp_path: Path) -> str:
    """The admin's /metrics of a server on a (fake) NVML GPU with a running workload whose process uses the GPU, a
    failed workload, a preemption and a queue with a quota, and the gateway's series (as ``tessera up`` registers
    them) after one answer: every family has samples."""
    from tessera.api import WorkloadSpec
    from tessera.backends.fake import FakeBackend, fake_pid
    from tessera.gpu.fakes import FakeGpu, FakeNvml
    from tessera.gpu.nvml import NvmlProbe
    from tessera.server.auth import ensure_admin_token
    from tessera.server.loop_values import LoopConfig
    from tessera.server.store.store import Event
    from tessera.server.submit import Principal, workload_row
    from tessera.server.up import UpConfig, build_server
    from tessera.serving.gateway.metrics import GatewayMetrics

    gpu = FakeGpu("NVIDIA A100-SXM4-80GB", 81920, "GPU-real-0", util_pct=40, power_mw=200_000)
    nvml = FakeNvml([gpu])
    nvml.nvmlInit()
    backend, clock = FakeBackend(), FakeClock()
    config = UpConfig(data_dir=tmp_path, loop=LoopConfig(run_dir=tmp_path, launch_wait_s=LOCKSTEP_S))
    server = build_server(config, probe=NvmlProbe(nvml), backend=backend, host=HOST, clock=clock)
    store, loop = server.ctx.store, server.ctx.loop
    ensure_admin_token(store, ADMIN, clock())
    gateway = GatewayMetrics()
    server.ctx.metrics.register(gateway.registry)
    gateway.answered("chat", "standard", 200, 10.0, 10.0, 10.2, 11.0, 5)  # a stream of five chunks
    from fastapi.testclient import TestClient

    with TestClient(server.app) as http:
        headers = {"Authorization": f"Bearer {ADMIN}"}
        queue = {"name": "team-a", "tenant": "team-a", "nominal": {"*": {"gpus": 1}}}
        assert http.post("/v1/queues", json=queue, headers=headers).status_code in (200, 201)
        ids = []
        for _ in range(2):
            spec = WorkloadSpec(command=["x"], gpus=1, gpu_fraction=0.25)
            row = workload_row(spec, Principal(None, True), store.queues(), server.ctx.pool, clock())
            ids.append(store.add_workload(row, clock()).id)
        loop.step()
        backend.finish(str(ids[1]), 1)
        store.update_workloads([], [Event(ids[0], "preempted", "for the test")], clock())
        loop.step()
        handle = loop.running[ids[0]].handle
        assert handle is not None
        gpu.processes = [(fake_pid(handle), 2048)]
        gpu.process_samples = [(fake_pid(handle), 10, 30)]
        response = http.get("/metrics", headers=headers)
        assert response.status_code == 200
        return response.text


def test_every_metric_the_dashboard_and_the_rules_name_is_exported(tmp_path: Path) -> None:
    text = _exported_by_a_server_with_nvml(tmp_path)
    families = list(text_string_to_metric_families(text))
    sampled = {s.name for f in families for s in f.samples}
    declared = {f.name for f in families} | {f"{f.name}_total" for f in families if f.type == "counter"}
    named = {
        name: query
        for query in dashboard_queries() + rule_queries()
        for name in metric_names(_grafana_to_promql(query))
    }
    assert len(named) >= 15
    missing = {n: q for n, q in named.items() if n not in sampled | declared | PROMETHEUS_OWN}
    assert not missing, f"named in deploy/ but not exported by /metrics: {missing}"
    unsampled = sorted(n for n in named if n not in sampled | PROMETHEUS_OWN)
    assert unsampled == ["tessera_model_replicas"]  # declared; its samples need a deployed model


# ----------------------------------------------------------------------------------- make run PROMETHEUS=1, live


def _query(prometheus: str, promql: str) -> list[dict[str, Any]]:
    response = httpx.get(f"{prometheus}/api/v1/query", params={"query": promql}, timeout=5)
    response.raise_for_status()
    result: list[dict[str, Any]] = response.json()["data"]["result"]
    return result


@pytest.fixture
def local_prometheus(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """run-local.sh as `make run PROMETHEUS=1` runs it, with this interpreter's tessera; stopped with SIGINT."""
    if shutil.which("prometheus") is None:
        pytest.skip("prometheus missing (Debian package prometheus; scripts/test-packages.sh)")
    tessera = tmp_path / "tessera"
    tessera.write_text(f'#!/bin/sh\nexec {sys.executable} -m tessera.cli "$@" --gpus 2xA100-80GB --run-as server\n')
    tessera.chmod(0o755)
    port, prom_port = free_port(), free_port()
    data = tmp_path / "data"
    env = {**os.environ, "PYTHON": sys.executable}
    env.pop("TESSERA_ADMIN_TOKEN", None)
    script = subprocess.Popen(
        ["bash", str(RUN_LOCAL), str(tessera), str(port), str(prom_port), str(data)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        yield f"http://127.0.0.1:{prom_port}", data
    finally:
        os.killpg(script.pid, signal.SIGINT)  # Ctrl-C in the terminal of make run
        try:
            output, _ = script.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(script.pid, signal.SIGKILL)
            output, _ = script.communicate()
        print(output.decode(errors="replace"))


@pytest.mark.e2e
def test_make_run_prometheus_scrapes_the_demo_with_the_admin_token(local_prometheus: tuple[str, Path]) -> None:
    prometheus, data = local_prometheus
    deadline = time.monotonic() + 90
    held: list[dict[str, Any]] = []
    up: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        try:
            up = _query(prometheus, 'up{job="tessera"}')
            held = _query(prometheus, "sum by (workload, queue) (tessera_workload_gpu_allocated_ratio)")
        except httpx.HTTPError:
            pass  # Prometheus is starting
        if up and up[0]["value"][1] == "1" and held:
            break
        time.sleep(1)
    assert up and up[0]["value"][1] == "1", f"Prometheus never scraped tessera: {up}"
    assert held, "no per-workload series: the scrape did not use the admin token, or the demo did not start"
    assert all(series["metric"]["queue"] for series in held)  # private labels: the admin's view
    submitted = _query(prometheus, "sum(tessera_workload_submissions_total)")
    assert submitted and float(submitted[0]["value"][1]) >= 1
    rules = httpx.get(f"{prometheus}/api/v1/rules", timeout=5).json()["data"]["groups"]
    assert [g["name"] for g in rules] == ["tessera"]  # alerts.yml is loaded
    assert (data / "prometheus" / "admin-token").exists()
