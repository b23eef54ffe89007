"""Models deployed on a real ``tessera up`` and used through its gateway with the official ``openai`` client: the
``tessera models`` CLI (deploy, list, delete, bad input), the replicas are workloads on a GPU share, a tenant's
token is its API key and sees only its models, the ``x-tessera-slo`` header picks a request's class, a model that
served goes back to zero after its idle timeout and frees its share (``tessera nodes``), then holds a burst of 50
concurrent requests while it starts (0 errors), and a replica that ends is restarted (it is a service)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from live_server import ADMIN, LiveServer, wait_for

pytestmark = pytest.mark.e2e


@pytest.fixture
def server(tmp_path: Path) -> Any:
    live = LiveServer(tmp_path / "server", gpus="2xA100-80GB")
    live.start()
    yield live
    try:
        with live.client() as client:
            for m in client.models():
                client.delete_model(m["name"])
            wait_for(lambda: not client.models(), timeout_s=30)
        live.cancel_all()
    finally:
        live.stop()


def gateway(server: LiveServer, token: str = ADMIN, **kwargs: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/openai/v1", api_key=token, max_retries=0, **kwargs)


def tessera(server: LiveServer, *args: str, token: str = ADMIN) -> subprocess.CompletedProcess[str]:
    """The CLI, as a user runs it (a wide terminal, so the table does not wrap)."""
    env = {"TESSERA_URL": server.url, "TESSERA_TOKEN": token, "PATH": "/usr/bin:/bin", "HOME": "/nonexistent"}
    env["COLUMNS"] = "200"
    paths = [os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if paths:  # the code under test, not another checkout installed in the environment
        env["PYTHONPATH"] = os.pathsep.join(paths)
    return subprocess.run(
        [sys.executable, "-m", "tessera.cli", *args], capture_output=True, text=True, env=env, timeout=60
    )


def model(server: LiveServer, name: str) -> dict[str, Any]:
    with server.client() as client:
        return client.model(name)


def test_the_models_cli_deploys_lists_and_deletes_and_refuses_bad_input_in_one_line(server: LiveServer) -> None:
    done = tessera(
        server, "models", "deploy", "cli-chat", "--engine", "sim", "--model", "llama3-8b", "--gpu-fraction", "0.25",
        "--min-replicas", "0", "--max-replicas", "2", "--idle-timeout", "5s", "--slo", "interactive", "--json",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    shown = json.loads(done.stdout)
    assert shown["name"] == "cli-chat" and shown["engine"] == "sim" and shown["state"] == "scaled-to-zero"
    assert shown["replicas"] == 0 and shown["openai_base_url"] == f"{server.url}/openai/v1"
    assert (shown["gpu_milli"], shown["min_replicas"], shown["max_replicas"], shown["slo"]) == (
        250,
        0,
        2,
        "interactive",
    )
    plain = tessera(server, "models", "deploy", "cli-two", "--engine", "sim", "--gpu-fraction", "0.5")
    assert plain.returncode == 0 and plain.stdout.startswith("model cli-two deployed (sim, 1-1 replicas; router ")
    assert f"OpenAI base URL: {server.url}/openai/v1" in plain.stdout
    wait_for(lambda: model(server, "cli-two")["state"] == "ready", timeout_s=30)

    listed = json.loads(tessera(server, "models", "--json").stdout)
    assert isinstance(listed, list) and [m["name"] for m in listed] == ["cli-chat", "cli-two"]
    assert [(m["engine"], m["state"], m["replicas"]) for m in listed] == [
        ("sim", "scaled-to-zero", 0),
        ("sim", "ready", 1),
    ]
    assert all(m["openai_base_url"] == f"{server.url}/openai/v1" for m in listed)
    table = tessera(server, "models").stdout.splitlines()
    assert all(
        word in table[1] for word in ("NAME", "ENGINE", "STATE", "CACHE", "REPLICAS", "SHARE", "OPENAI BASE URL")
    )
    rows = {line.split()[1]: line.split() for line in table if line.startswith("│")}
    assert rows["cli-chat"][1:9] == ["cli-chat", "│", "default", "│", "sim", "│", "scaled-to-zero", "│"]
    assert "0/0 (0-2)" in " ".join(rows["cli-chat"]) and "25%" in rows["cli-chat"]
    assert "ready" in rows["cli-two"] and "1/1 (1-1)" in " ".join(rows["cli-two"]) and "50%" in rows["cli-two"]

    # Bad input: one line naming the option, exit 2, no traceback; nothing deployed.
    for args, field in [
        (["--engine", "tpu"], "engine"),
        (["--slo", "urgent"], "slo"),
        (["--idle-timeout", "soon"], "idle_timeout"),
        (["--gpu-fraction", "1.5"], "gpu_fraction"),
        (["--gpus", "0", "--gpu-fraction", "0.5"], "gpu_fraction"),
        (["--min-replicas", "3", "--max-replicas", "2"], "max_replicas"),
        (["--model", "no-such-model"], "model"),
    ]:
        bad = tessera(server, "models", "deploy", "bad", *args)
        assert bad.returncode == 2 and bad.stdout == "", (args, bad.stdout)
        assert bad.stderr.startswith(f"error: {field}: ") and bad.stderr.count("\n") == 1, (args, bad.stderr)
        assert "Traceback" not in bad.stderr
    # A value the CLI itself cannot parse gets typer's usage message (a box of several lines), naming the option.
    unparsed = tessera(server, "models", "deploy", "bad", "--gpus", "two")
    assert unparsed.returncode == 2 and "'--gpus'" in unparsed.stderr and "Traceback" not in unparsed.stderr
    taken = tessera(server, "models", "deploy", "cli-two", "--engine", "sim")
    assert taken.returncode == 2 and taken.stderr.startswith("error: ") and taken.stderr.count("\n") == 1
    assert "already deployed" in taken.stderr
    missing = tessera(server, "models", "delete", "nope")
    assert missing.returncode == 2 and missing.stderr == "error: no model 'nope'\n"
    assert [m["name"] for m in json.loads(tessera(server, "models", "--json").stdout)] == ["cli-chat", "cli-two"]

    gone = tessera(server, "models", "delete", "cli-two")
    assert gone.returncode == 0 and gone.stdout.startswith("model cli-two: deleting (1 replicas stopping)")
    assert tessera(server, "models", "delete", "cli-chat").returncode == 0
    wait_for(lambda: json.loads(tessera(server, "models", "--json").stdout) == [], timeout_s=30)
    assert tessera(server, "models").stdout.startswith("no models deployed")


def test_chat_streaming_and_the_model_list_through_the_gateway(server: LiveServer) -> None:
    with server.client() as client:
        out = client.deploy_model({"name": "chat", "engine": "sim", "model": "llama3-8b", "gpu_fraction": 0.25})
        assert out["openai_base_url"] == f"{server.url}/openai/v1"
        team = client.create_token("team-a")["token"]
    wait_for(lambda: model(server, "chat")["state"] == "ready", timeout_s=30)
    ai = gateway(server)
    answer = ai.chat.completions.create(model="chat", messages=[{"role": "user", "content": "hi"}], max_tokens=8)
    assert answer.choices[0].message.content and answer.usage is not None and answer.usage.completion_tokens == 8
    chunks = ai.chat.completions.create(
        model="chat", messages=[{"role": "user", "content": "hi"}], max_tokens=5, stream=True
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len(text.split()) == 5
    assert [m.id for m in ai.models.list()] == ["chat"]
    # The x-tessera-slo header serves one request under another class than the model's (standard).
    urgent = ai.with_options(default_headers={"x-tessera-slo": "interactive"})
    assert urgent.completions.create(model="chat", prompt="now", max_tokens=2).choices[0].text
    # Another tenant's key sees no model and gets OpenAI's 404 for this one.
    assert [m.id for m in gateway(server, team).models.list()] == []
    with pytest.raises(openai.NotFoundError):
        gateway(server, team).chat.completions.create(model="chat", messages=[{"role": "user", "content": "x"}])
    with pytest.raises(openai.AuthenticationError):
        gateway(server, "not-a-token").models.list()
    # Per model and SLO class, for admins; the public scrape names no model.
    admin = httpx.get(f"{server.url}/metrics", headers={"Authorization": f"Bearer {ADMIN}"}).text
    assert 'tessera_gateway_time_to_first_token_seconds_count{served_model="chat",slo="standard"} 2.0' in admin
    assert 'tessera_gateway_time_per_output_token_seconds_count{served_model="chat",slo="standard"} 1.0' in admin
    assert 'tessera_gateway_requests_total{code="200",served_model="chat",slo="standard"} 2.0' in admin
    assert 'tessera_gateway_requests_total{code="200",served_model="chat",slo="interactive"} 1.0' in admin
    assert 'tessera_gateway_time_to_first_token_seconds_count{served_model="chat",slo="interactive"} 1.0' in admin
    assert 'tessera_model_state{served_model="chat",state="ready"} 1.0' in admin
    assert 'tessera_model_state{served_model="chat",state="scaled-to-zero"} 0.0' in admin
    assert 'tessera_model_starts_total{served_model="chat",tier="cold"} 1.0' in admin
    assert 'tessera_model_evictions_total{served_model="chat"} 0.0' in admin
    assert 'tessera_model_replicas{kind="running",served_model="chat"} 1.0' in admin
    assert 'tessera_model_replica_starts_total{served_model="chat"} 1.0' in admin
    assert "tessera_gateway_route_decision_seconds_count 3.0" in admin
    assert "served_model" not in httpx.get(f"{server.url}/metrics").text


def gpu_lines(server: LiveServer) -> list[str]:
    """The GPU lines of ``tessera nodes`` (the CLI)."""
    out = tessera(server, "nodes")
    assert out.returncode == 0, out.stderr
    return [line for line in out.stdout.splitlines() if line.lstrip().startswith("GPU ")]


def test_a_model_back_at_zero_frees_its_share_then_holds_a_burst_of_50_while_it_starts(server: LiveServer) -> None:
    deployed = tessera(
        server, "models", "deploy", "burst", "--engine", "sim", "--model", "llama3-8b", "--gpu-fraction", "0.5",
        "--min-replicas", "0", "--max-replicas", "2", "--idle-timeout", "3s", "--json",
    )  # fmt: skip
    assert deployed.returncode == 0 and json.loads(deployed.stdout)["state"] == "scaled-to-zero", deployed.stderr
    # Served once (held while its first replica starts), it holds its share: 50% of a GPU in `tessera nodes`.
    ai = gateway(server, timeout=120)
    assert ai.completions.create(model="burst", prompt="wake up", max_tokens=2).choices[0].text
    served_at = time.monotonic()
    assert model(server, "burst")["replicas"] == 1
    assert sorted(" 50.0%" in line for line in gpu_lines(server)) == [False, True]
    # Idle past its timeout: 0 replicas, and the share is free in `tessera nodes`.
    wait_for(lambda: model(server, "burst")["state"] == "scaled-to-zero", timeout_s=60)
    idle_s = time.monotonic() - served_at
    listed = json.loads(tessera(server, "models", "--json").stdout)
    assert [(m["name"], m["replicas"], m["state"]) for m in listed] == [("burst", 0, "scaled-to-zero")]
    lines = gpu_lines(server)
    assert len(lines) == 2 and all("   0.0%" in line and "workloads -" in line for line in lines), lines

    async def burst() -> list[float | BaseException]:
        client = openai.AsyncOpenAI(base_url=f"{server.url}/openai/v1", api_key=ADMIN, max_retries=0, timeout=120)

        async def one(i: int) -> float:
            start = time.monotonic()
            stream = await client.chat.completions.create(
                model="burst", messages=[{"role": "user", "content": f"hello {i}"}], max_tokens=8, stream=True
            )
            first: float | None = None
            async for _ in stream:
                first = time.monotonic() - start if first is None else first
            assert first is not None
            return first

        return await asyncio.gather(*(one(i) for i in range(50)), return_exceptions=True)

    results = asyncio.run(burst())
    errors = [r for r in results if isinstance(r, BaseException)]
    assert errors == [], errors[:3]
    ttft = sorted(r for r in results if isinstance(r, float))
    assert len(ttft) == 50
    print(
        f"\nscaled to zero {idle_s:.1f} s after its last request (idle timeout 3 s), share free in `tessera nodes`; "
        f"then 50 concurrent streaming requests, 0 errors, TTFT (replica start included) min {ttft[0]:.2f} s, "
        f"median {statistics.median(ttft):.2f} s, p90 {ttft[44]:.2f} s, max {ttft[-1]:.2f} s"
    )
    assert model(server, "burst")["replicas"] >= 1


def test_a_replica_that_dies_is_restarted_and_the_gateway_keeps_serving(server: LiveServer) -> None:
    with server.client() as client:
        client.deploy_model({"name": "phoenix", "engine": "sim", "gpu_fraction": 0.25})
        first = wait_for(lambda: model(server, "phoenix")["replica_workloads"], timeout_s=30)[0]
        wait_for(lambda: model(server, "phoenix")["state"] == "ready", timeout_s=30)
        client.cancel(first)  # the replica goes away; the controller asks for another
    wait_for(lambda: first not in model(server, "phoenix")["replica_workloads"], timeout_s=30)
    wait_for(lambda: model(server, "phoenix")["replicas"] == 1, timeout_s=30)
    ai = gateway(server, timeout=60)
    answer = ai.completions.create(model="phoenix", prompt="once upon", max_tokens=4)
    assert answer.choices[0].text


def test_kill_9_of_the_server_while_replicas_stream_readopts_them_and_serves_again(server: LiveServer) -> None:
    with server.client() as client:
        client.deploy_model({"name": "durable", "engine": "sim", "gpu_fraction": 0.25, "min_replicas": 2})
    wait_for(lambda: model(server, "durable")["replicas"] == 2, timeout_s=30)
    before = sorted(model(server, "durable")["replica_workloads"])
    ai = gateway(server, timeout=30)
    stream = ai.chat.completions.create(
        model="durable", messages=[{"role": "user", "content": "tell me"}], max_tokens=2000, stream=True
    )
    first = next(iter(stream))
    assert first.choices is not None
    server.kill_hard()
    with pytest.raises(openai.APIError):  # the stream ends with a clean error, not a hang or a truncated success
        for _ in stream:
            pass
    server.start()
    wait_for(lambda: model(server, "durable")["replicas"] == 2, timeout_s=30)
    assert sorted(model(server, "durable")["replica_workloads"]) == before  # re-adopted, none launched again
    with server.client() as client:
        assert all(client.workload(i)["attempts"] == 1 for i in before)
    answer = wait_for(
        lambda: _try(lambda: gateway(server).completions.create(model="durable", prompt="again", max_tokens=3)),
        timeout_s=30,
    )
    assert answer.choices[0].text


def _try(call: Any) -> Any:
    try:
        return call()
    except openai.APIError:
        return None


def test_a_model_whose_engine_cannot_start_shows_failing_backs_off_and_fails_requests_fast(
    server: LiveServer,
) -> None:
    """``models deploy x --engine vllm --model /nonexistent`` once showed ``ready`` while 55 replicas failed in 60 s
    with no back-off, and a client hung. Now: ``failing`` with the engine's last line, replicas started ever more
    slowly, a request answered 503 with Retry-After at once, the CLI and the metric say so."""
    with server.client() as client:
        client.deploy_model({"name": "broken", "engine": "vllm", "model": "/nonexistent", "gpu_fraction": 0.25})
        failing = wait_for(
            lambda: (m := client.model("broken"))["state"] == "failing" and m, timeout_s=60, interval_s=0.5
        )
        assert failing["last_error"] and failing["replica_failures"] >= 2 and failing["replicas"] == 0
        started = time.monotonic()
        ai = gateway(server, timeout=30)
        with pytest.raises(openai.InternalServerError) as raised:
            ai.completions.create(model="broken", prompt="hello", max_tokens=2)
        waited = time.monotonic() - started
        assert raised.value.status_code == 503 and int(raised.value.response.headers["retry-after"]) >= 1
        assert "is failing" in str(raised.value) and waited < 5
        time.sleep(15)
        replicas = client.workloads(name="broken-replica")
        metrics = httpx.get(f"{server.url}/metrics", headers={"authorization": f"Bearer {ADMIN}"}).text
    assert len(replicas) <= 8, len(replicas)  # backing off: not one start per second (the old code: ~55 a minute)
    assert 'tessera_model_failing{served_model="broken"} 1.0' in metrics
    listed = tessera(server, "models")
    assert listed.returncode == 0 and "failing" in listed.stdout and "replica failures in a row" in listed.stdout


def _engine_pids(model_name: str) -> list[int]:
    """The sim engine processes serving ``model_name`` (found by their command line)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue
        if b"tessera.serving.engines.sim_server" in argv and model_name.encode() in argv:
            found.append(int(cmdline.parent.name))
    return found


def test_a_replica_that_stalls_mid_stream_ends_the_stream_with_an_error_event(tmp_path: Path) -> None:
    """A replica stopped with SIGSTOP once held its client's stream for ever. A stream silent for the chunk gap
    (here 2 s, ``TESSERA_GATEWAY_CHUNK_GAP_S``; 300 s by default) ends with an error event the client sees."""
    live = LiveServer(tmp_path / "server", gpus="1xA100-80GB", env={"TESSERA_GATEWAY_CHUNK_GAP_S": "2"})
    live.start()
    stopped: list[int] = []
    try:
        with live.client() as client:
            client.deploy_model({"name": "stalls", "engine": "sim", "gpu_fraction": 0.25})
        wait_for(lambda: model(live, "stalls")["replicas"] == 1, timeout_s=30)
        stream = gateway(live, timeout=60).chat.completions.create(
            model="stalls", messages=[{"role": "user", "content": "go on"}], max_tokens=5000, stream=True
        )
        assert next(iter(stream)).choices is not None
        stopped = _engine_pids("stalls")
        assert stopped
        for pid in stopped:
            os.kill(pid, signal.SIGSTOP)
        started = time.monotonic()
        with pytest.raises(openai.APIError, match="no data from the replica for 2 s"):
            for _ in stream:
                pass
        assert time.monotonic() - started < 20
    finally:
        for pid in stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        live.cancel_all()
        live.stop()
