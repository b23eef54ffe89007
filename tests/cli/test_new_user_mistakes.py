"""What a new user tripped on (issue 25, defect 9), each an error of one line with exit 2 or what the user meant:
``--gpu-type`` without ``--gpus`` asks for one GPU (it gave a CPU-only workload); ``nan``/``inf`` in a number option
or a spec file, and a spec, queue or config file that is not UTF-8, are one line naming the option or file (they
were tracebacks with exit 1); ``--url``/``--token`` before the subcommand work (``tessera --token X jobs`` was
refused); ``jobs --queue nope`` names the unknown queue (it was an empty table with exit 0). Commands that call the
server run against a stand-in client (``commands.client_for``), as in test_jobs_table."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from cli_checks import assert_one_line_error
from typer.testing import CliRunner

from tessera.cli import commands, options
from tessera.cli.main import app


class StandIn:
    """The few client calls these commands make; ``submitted`` keeps the bodies sent."""

    def __init__(self, queues: tuple[str, ...] = ("default",)) -> None:
        self.submitted: list[dict[str, Any]] = []
        self.queue_names = queues

    def submit(self, body: dict[str, Any]) -> dict[str, Any]:
        self.submitted.append(body)
        return {"id": 1, "queue": "default", "state": "pending", "array_id": None}

    def workloads(self, states: Any, queue: Any, array: Any = None) -> list[dict[str, Any]]:
        return []

    def queues(self) -> list[dict[str, Any]]:
        return [{"name": name} for name in self.queue_names]


@pytest.fixture
def stand_in(monkeypatch: pytest.MonkeyPatch) -> StandIn:
    client = StandIn(queues=("default", "team-a"))

    @contextmanager
    def client_for(url: Any, token: Any) -> Iterator[StandIn]:
        yield client

    monkeypatch.setattr(commands, "client_for", client_for)
    return client


def tessera(*args: str) -> subprocess.CompletedProcess[str]:
    """The real entry point (``run_app``): typer's own errors become one line there."""
    env = {**os.environ, "TESSERA_URL": "http://127.0.0.1:9", "COLUMNS": "80"}
    return subprocess.run([sys.executable, "-m", "tessera.cli", *args], capture_output=True, text=True, env=env)


@pytest.mark.parametrize(
    ("gpu_flags", "gpus"),
    [(["--gpu-type", "H100"], 1), (["--gpu-type", "A100,H100", "--gpus", "2"], 2), (["--gpus", "0"], 0)],
)
def test_a_gpu_type_without_gpus_asks_for_one_gpu(stand_in: StandIn, gpu_flags: list[str], gpus: int) -> None:
    result = CliRunner().invoke(app, ["submit", *gpu_flags, "--", "true"])
    assert result.exit_code == 0, result.output
    (body,) = stand_in.submitted
    assert body["gpus"] == gpus


def test_a_gpu_type_in_a_spec_file_without_gpus_asks_for_one_gpu(stand_in: StandIn, tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text("command: [true]\ngpu_types: [H100]\n")
    assert CliRunner().invoke(app, ["submit", "-f", str(spec)]).exit_code == 0
    assert stand_in.submitted[0]["gpus"] == 1


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (("submit", "--gpu-fraction", "nan", "--", "true"), "--gpu-fraction"),
        (("submit", "--gpu-fraction", "inf", "--", "true"), "--gpu-fraction"),
        (("models", "deploy", "m", "--gpu-fraction", "-inf"), "--gpu-fraction"),
        (("simulate", "serving", "--load", "nan", "--out", "/nonexistent/x"), "--load"),
        (("simulate", "serving", "--zipf", "inf", "--out", "/nonexistent/x"), "--zipf"),
        (("simulate", "fgd", "--out", "/nonexistent/x", "--inflate", "nan"), "--inflate"),
        (("simulate", "timeline", "--out", "/nonexistent/x", "--gpu-scale", "inf"), "--gpu-scale"),
        (("history", "--since", "nan"), "--since"),
    ],
)
def test_nan_and_inf_in_a_number_option_are_one_line_naming_it(args: tuple[str, ...], option: str) -> None:
    done = tessera(*args)
    assert done.returncode == 2, (done.returncode, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and option in lines[0], done.stderr
    assert "finite" in lines[0] and "Traceback" not in done.stderr


def test_nan_in_a_spec_file_names_its_line_and_field(tmp_path: Path) -> None:
    """A YAML ``.nan`` reached the SDK, whose JSON encoder raised ValueError (a traceback); the SDK now refuses
    a body with NaN or infinity as an ApiError naming the field, which the CLI locates in the file."""
    spec = tmp_path / "spec.yaml"
    spec.write_text("command: [true]\ngpus: 1\ngpu_fraction: .nan\n")
    with pytest.MonkeyPatch.context() as m:
        m.setattr(commands, "client_for", options.client_for)  # the real SDK: it refuses the body before connecting
        result = CliRunner().invoke(app, ["submit", "-f", str(spec), "--url", "http://127.0.0.1:9"])
    assert_one_line_error(result, f"{spec}:3: gpu_fraction: must be a finite number, not nan")


@pytest.mark.parametrize(
    ("args", "name"),
    [(("submit", "-f"), "spec.yaml"), (("queues", "apply", "-f"), "queues.yaml")],
)
def test_a_file_that_is_not_utf8_is_one_line_naming_it(
    stand_in: StandIn, tmp_path: Path, args: tuple[str, ...], name: str
) -> None:
    path = tmp_path / name
    path.write_bytes(b"command: [true]\nname: caf\xe9\n")
    result = CliRunner().invoke(app, [*args, str(path)])
    assert_one_line_error(result, f"{path}:2: not UTF-8 text (byte 0xe9")


def test_a_config_file_that_is_not_utf8_is_one_line_naming_it(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_bytes(b"url: \xff\n")
    result = CliRunner().invoke(app, ["jobs"], env={"TESSERA_CONFIG": str(config)})
    assert_one_line_error(result, f"{config}:1: not UTF-8 text")


def test_url_and_token_before_the_subcommand_are_used(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("url", "token"):  # put back after the test: the next commands' callback sets them again anyway
        monkeypatch.setattr(options.BEFORE_COMMAND, name, None)
    result = CliRunner().invoke(app, ["--url", "http://127.0.0.1:9", "--token", "tsr_before", "jobs"])
    assert_one_line_error(result, "cannot reach the Tessera server at http://127.0.0.1:9")
    with options.client_for(None, None) as client:  # what `jobs` was given, as the root callback recorded it
        assert client.url == "http://127.0.0.1:9"
        assert client._http.headers["Authorization"] == "Bearer tsr_before"
    with options.client_for("http://127.0.0.1:10", "tsr_after") as client:  # the command's own win
        assert client.url == "http://127.0.0.1:10" and client._http.headers["Authorization"] == "Bearer tsr_after"


def test_jobs_of_an_unknown_queue_is_an_error_and_of_an_empty_one_an_empty_table(stand_in: StandIn) -> None:
    result = CliRunner().invoke(app, ["jobs", "--queue", "nope"])
    assert_one_line_error(result, "--queue: no queue 'nope' (yours: default, team-a)")
    empty = CliRunner().invoke(app, ["jobs", "--queue", "team-a"])
    assert empty.exit_code == 0, empty.output
    (header,) = empty.output.splitlines()  # the header alone
    assert header.split()[:2] == ["ID", "NAME"]
