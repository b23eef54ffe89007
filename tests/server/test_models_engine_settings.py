"""A model's own engine settings (``models deploy --engine-arg/--cpus/--cpu-bind/--kv-...``) through the API: stored,
shown, given to each replica (its CPU request, the engine shim's flags), refused naming the field when bad; a store of
an older revision keeps its models with none; ``tessera models deploy/show`` take and print them, and a bad one is
one line with exit 2."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from server_harness import ADMIN, MakeHarness
from sqlalchemy import text
from test_models_api import controller, deploy, model
from typer.testing import CliRunner, Result

import tessera.cli.models
from tessera.cli.main import app
from tessera.client.http import TesseraClient
from tessera.server.serving_plane import deployed
from tessera.server.store import served
from tessera.server.store.db import downgrade, open_engine, upgrade
from tessera.server.store.store import Store
from tessera.serving.engine_settings import EngineSettings


def test_a_models_engine_settings_are_shown_and_reach_each_replica(make_harness: MakeHarness) -> None:
    h = make_harness("1xA100-80GB")
    out = deploy(
        h, name="chat", engine="vllm", model="/srv/m", gpus=0, cpus="2500m", cpu_bind="0-7", kv_events=True,
        engine_args=["--dtype", "float32", "--max-model-len=512"],
    )  # fmt: skip
    settings = {"engine_args": ["--dtype", "float32", "--max-model-len=512"], "cpu_milli": 2500, "cpu_bind": "0-7"}
    assert {k: out[k] for k in settings} == settings and out["kv_events"] is True and out["kv_offload_gib"] == 0
    plain = deploy(h, name="plain", engine="sim", gpu_fraction=0.25)
    assert (plain["engine_args"], plain["cpu_milli"], plain["cpu_bind"], plain["kv_events"]) == ([], 0, "", False)
    controller(h).tick(h.clock())
    h.step()
    shown = model(h, "chat")
    assert {k: shown[k] for k in settings} == settings
    [replica] = [h.get(i) for i in shown["replica_workloads"]]
    assert replica["cpu_milli"] == 2500  # the replica workload's CPU request: its quota, counted on the node
    argv = list({s.workload_id: s for s in h.backend.launched}[str(replica["id"])].argv)
    shim = argv[argv.index("tessera.serving.engine_exec") + 1 :]
    assert shim[shim.index("--cpus") + 1] == "3" and shim[shim.index("--cpu-bind") + 1] == "0-7"
    assert "--kv-events" in shim and shim[shim.index("--") :] == ["--", "--dtype", "float32", "--max-model-len=512"]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"engine": "vllm", "engine_args": ["--port", "9000"]}, "engine_args"),
        ({"engine": "vllm", "engine_args": ["--served_model_name=other"]}, "engine_args"),
        ({"engine": "sim", "engine_args": ["--uds=/tmp/elsewhere.sock"]}, "engine_args"),
        ({"engine": "vllm", "engine_args": ["x"] * 65}, "engine_args"),
        ({"engine": "vllm", "engine_args": "--dtype float32"}, "engine_args"),  # a list, not a string
        ({"engine": "vllm", "cpus": "lots"}, "cpus"),
        ({"engine": "vllm", "cpus": -1}, "cpus"),
        ({"engine": "vllm", "cpus": 64}, "cpus"),  # the node has 32: no replica could ever be placed
        ({"engine": "vllm", "cpu_bind": "0-x"}, "cpu_bind"),
        ({"engine": "vllm", "kv_offload_gib": -1}, "kv_offload_gib"),
        ({"engine": "vllm", "kv_offload_gib": "8"}, "kv_offload_gib"),
        ({"engine": "sim", "kv_offload_gib": 8}, "kv_offload_gib"),
        ({"engine": "sim", "kv_events": True}, "kv_events"),
        ({"engine": "vllm", "kv_events": "yes"}, "kv_events"),
    ],
)
def test_bad_engine_settings_are_refused_naming_the_field(
    make_harness: MakeHarness, body: dict[str, Any], field: str
) -> None:
    h = make_harness("1xA100-80GB")
    full = {"name": "x", "gpus": 0, **body, **({"model": "/srv/m"} if body["engine"] == "vllm" else {})}
    response = h.http.post("/v1/models", json=full, headers=h.as_(ADMIN))
    assert response.status_code == 422, response.text
    assert response.json()["field"] == field, response.json()
    assert h.http.get("/v1/models", headers=h.as_(ADMIN)).json() == []


def test_revision_0009_gives_older_models_no_engine_settings(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    engine = open_engine(url, migrate=False)
    upgrade(engine, "0008")
    with engine.begin() as connection:
        connection.execute(
            text(
                "INSERT INTO served_models (name, tenant, queue, engine, weights, num_gpus, gpu_milli, gpu_mem_mib,"
                " min_replicas, max_replicas, idle_timeout_s, slo, router, desired_replicas, deleting, created_at)"
                " VALUES ('old', 't', 'default', 'sim', '', 1, 250, 0, 1, 1, 30.0, 'standard', 'least-load', 1, 0,"
                " 1.0)"
            )
        )
    engine.dispose()
    store = Store(open_engine(url))  # -> newest
    columns = "engine_args, cpu_milli, cpu_bind, kv_offload_gib, kv_events"
    with store.engine.connect() as connection:
        row = connection.execute(text(f"SELECT {columns} FROM served_models")).one()
    assert tuple(row) in (("[]", 0, "", 0.0, 0), ([], 0, "", 0.0, False))
    stored = served.model(store, "old")
    assert stored is not None and deployed(stored).engine_settings == EngineSettings()
    downgrade(store.engine, "0008")
    with store.engine.connect() as connection:
        kept = set(connection.execute(text("SELECT * FROM served_models")).keys())
    assert not kept & set(columns.split(", ")) and "autoscaler" in kept


@pytest.fixture
def cli(make_harness: MakeHarness, monkeypatch: pytest.MonkeyPatch) -> Callable[..., Result]:
    """``tessera models ...`` against an in-process server (the SDK over the app, no socket)."""
    h = make_harness("1xA100-80GB")

    def forward(request: httpx.Request) -> httpx.Response:
        answer = h.http.request(
            request.method, request.url.path, params=request.url.params, headers=request.headers,
            content=request.content,
        )  # fmt: skip
        return httpx.Response(answer.status_code, headers=answer.headers, content=answer.content)

    @contextmanager
    def client_for(url: Any, token: Any) -> Iterator[TesseraClient]:
        with TesseraClient("http://tessera", ADMIN, transport=httpx.MockTransport(forward)) as client:
            yield client

    monkeypatch.setattr(tessera.cli.models, "client_for", client_for)
    return lambda *args: CliRunner().invoke(app, ["models", *args], env={"COLUMNS": "200"})


def test_models_deploy_takes_the_engine_settings_and_show_and_list_print_them(cli: Callable[..., Result]) -> None:
    deployed = cli(
        "deploy", "chat", "--engine", "vllm", "--model", "/srv/m", "--gpus", "0", "--cpus", "2", "--cpu-bind", "0-3",
        "--engine-arg", "--dtype float32", "--engine-arg", "--enable-prefix-caching",
        "--engine-arg=--max-model-len=512", "--kv-events",
    )  # fmt: skip
    assert deployed.exit_code == 0, deployed.output
    shown = cli("show", "chat")
    assert shown.exit_code == 0, shown.output
    lines = {line.split(":", 1)[0]: line.split(":", 1)[1].strip() for line in shown.stdout.splitlines()}
    assert lines["engine args"] == "--dtype float32 --enable-prefix-caching --max-model-len=512"
    assert lines["cpus"] == "2 (binds among: 0-3)" and lines["kv"] == "events" and lines["engine"] == "vllm"
    assert "2 CPU" in cli().stdout  # the list's share column
    as_json = json.loads(cli("show", "chat", "--json").stdout)
    assert as_json["engine_args"] == ["--dtype", "float32", "--enable-prefix-caching", "--max-model-len=512"]


@pytest.mark.parametrize(
    ("flags", "fragments"),
    [
        (("--engine-arg", "--port 9000"), ("engine_args", "--port", "set by Tessera")),
        (("--engine-arg", "--dtype 'float32"), ("--engine-arg", "quotation")),
        (("--cpus", "lots"), ("cpus", "not a CPU amount")),
        (("--cpu-bind", "0-x"), ("cpu_bind",)),
    ],
)
def test_bad_engine_settings_are_one_line_with_exit_2(
    cli: Callable[..., Result], flags: tuple[str, ...], fragments: tuple[str, ...]
) -> None:
    done = cli("deploy", "x", "--engine", "vllm", "--model", "/srv/m", "--gpus", "0", *flags)
    assert done.exit_code == 2, done.output
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("error: ") and all(f in line for f in fragments), line
    assert "Traceback" not in done.output
