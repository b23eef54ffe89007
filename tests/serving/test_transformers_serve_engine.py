"""The ``transformers serve`` adapter against answers recorded from the real server (``transformers_recorded/``,
replayed by ``engine_fake``): pinned to one model or serving several on demand (each folder linked under its name in
the process's working directory), health, no metrics to read, and its model manager as the sleep mode (``/reset``
unloads everything, ``/load_model`` loads, saying whether the model was loaded already)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from engine_fake import Canned, FakeEngine, serving_on_own_loop

from tessera.serving.engines.base import EngineError, EngineStats
from tessera.serving.engines.transformers_serve import TransformersServeEngine

RECORDED = Path(__file__).parent / "transformers_recorded"


def folders(tmp_path: Path, *names: str) -> dict[str, str]:
    out = {}
    for name in names:
        (tmp_path / name).mkdir()
        out[name] = str(tmp_path / name)
    return out


def test_pinned_it_loads_one_folder_under_the_deployed_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    weights = folders(tmp_path, "w")["w"]
    engine = TransformersServeEngine("chat", 8001, weights=weights, python="/venv/bin/python")
    command = engine.command()
    argv = list(command.argv)
    assert engine.pinned and argv[:5] == ["/venv/bin/python", "-m", "transformers.cli.transformers", "serve", "chat"]
    assert "--model-timeout" not in argv and argv[argv.index("--port") + 1] == "8001"
    assert command.cwd is not None and (Path(command.cwd) / "chat").resolve() == Path(weights)
    assert command.env["HF_HUB_OFFLINE"] == "1"


def test_on_demand_it_serves_several_folders_and_unloads_them_when_idle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    given = folders(tmp_path, "wa", "wb")
    engine = TransformersServeEngine(
        "a", 8001, weights=given["wa"], others={"b": given["wb"]}, model_timeout_s=5, env={"CUDA_VISIBLE_DEVICES": ""}
    )
    command = engine.command()
    argv = list(command.argv)
    assert not engine.pinned and engine.models == {"a": given["wa"], "b": given["wb"]}
    assert argv[3:5] == ["serve", "--host"]  # no model named: it loads what requests name
    assert argv[argv.index("--model-timeout") + 1] == "5" and argv[argv.index("--device") + 1] == "cpu"
    assert command.cwd is not None
    assert [(Path(command.cwd) / n).resolve() for n in ("a", "b")] == [Path(given["wa"]), Path(given["wb"])]


@pytest.fixture
def fake() -> Iterator[tuple[asyncio.AbstractEventLoop, FakeEngine]]:
    loaded: set[str] = set()

    def load(body: bytes) -> Canned:
        name = json.loads(body)["model"]
        if name == "missing":
            return Canned(200, (RECORDED / "load_error.sse").read_bytes(), "text/event-stream")
        recorded = "load_hot.sse" if name in loaded else "load_cold.sse"
        loaded.add(name)
        return Canned(200, (RECORDED / recorded).read_bytes().replace(b"tiny-a@", f"{name}@".encode()))

    def reset(body: bytes) -> Canned:
        loaded.clear()
        return Canned(200, b'{"status":"ok"}')

    server = FakeEngine(
        {
            ("GET", "/health"): Canned(200, b'{"status":"ok"}'),
            ("POST", "/load_model"): load,
            ("POST", "/reset"): reset,
        }
    )
    yield from serving_on_own_loop(server)


def test_health_load_and_the_model_manager_as_sleep_mode(fake: tuple[asyncio.AbstractEventLoop, FakeEngine]) -> None:
    loop, server = fake
    engine = TransformersServeEngine("a", server.port, others={"b": "/wb"}, model_timeout_s=5)
    assert engine.sleep_capable and loop.run_until_complete(engine.health())
    assert loop.run_until_complete(engine.stats()) == EngineStats()  # no /metrics: nothing asked
    assert loop.run_until_complete(engine.load("a")) is False  # cold: this call loaded it
    assert loop.run_until_complete(engine.load("a")) is True  # hot
    loop.run_until_complete(engine.sleep())  # /reset: everything unloaded
    assert loop.run_until_complete(engine.load("a")) is False
    loop.run_until_complete(engine.wake())  # loads each of its models
    with pytest.raises(EngineError, match="could not load 'missing'.*huggingface"):
        loop.run_until_complete(engine.load("missing"))
    loop.run_until_complete(engine.stop())
    asked = [(m, p, json.loads(b)["model"] if b else None) for m, p, b in server.calls if p != "/health"]
    assert asked == [
        ("POST", "/load_model", "a"),
        ("POST", "/load_model", "a"),
        ("POST", "/reset", None),
        ("POST", "/load_model", "a"),
        ("POST", "/load_model", "a"),
        ("POST", "/load_model", "b"),
        ("POST", "/load_model", "missing"),
    ]
