"""``tessera queues apply -f``'s file (``cli/queuefile.py``): Kueue's words turned into the API's queue bodies, and
every mistake reported as FILE:LINE: field: message with exit code 2, before anything is sent."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_checks import assert_one_line_error
from typer.testing import CliRunner

from tessera.api import QueueIn
from tessera.cli.main import app
from tessera.cli.queuefile import load_queue_file
from tessera.errors import InputFileError

runner = CliRunner()

GOOD = """\
queues:
  - name: team-a
    cohort: research
    queueingStrategy: StrictFIFO
    weight: 2
    flavors:
      - name: "*"
        nominalQuota: {gpus: 4, cpu: 32, memory: 128Gi}
        borrowingLimit: {gpus: 2}
        lendingLimit:
          nvidia.com/gpu: 1
      - name: A100-80GB
        nominalQuota: {gpus: 1.5}
  - name: team-b
    tenant: b
"""


def test_kueue_words_become_queue_bodies(tmp_path: Path) -> None:
    path = tmp_path / "queues.yaml"
    path.write_text(GOOD)
    a, b = load_queue_file(path)
    assert a.body == {
        "name": "team-a",
        "tenant": "team-a",
        "cohort": "research",
        "strategy": "StrictFIFO",
        "weight": 2,
        "nominal": {"*": {"gpus": 4, "cpu": 32, "mem": "128Gi"}, "A100-80GB": {"gpus": 1.5}},
        "borrowing_limit": {"*": {"gpus": 2}},
        "lending_limit": {"*": {"gpus": 1}},
    }
    assert b.body == {"name": "team-b", "tenant": "b"}
    QueueIn.model_validate(a.body)
    QueueIn.model_validate(b.body)


@pytest.mark.parametrize(
    ("text", "line", "field"),
    [
        ("queues:\n  - name: a\n    nominal: {gpus: 1}\n", 3, "queues[0].nominal"),  # the API's word, not Kueue's
        (
            "queues:\n  - name: a\n    flavors:\n      - name: '*'\n        nominalQuota: {gpu: 1}\n",
            5,
            "queues[0].flavors[0].nominalQuota.gpu",
        ),
        ("queues:\n  - tenant: a\n", 2, "queues[0].name"),
        ("queues:\n  - name: a\n  - name: a\n", 3, "name"),
        ("queue:\n  - name: a\n", 1, "queue"),
        ("queues:\n  - name: a\n    flavors: {name: x}\n", 3, "queues[0].flavors"),
        ("queues:\n  - name: a\n    flavors:\n      - nominalQuota: {gpus: 1}\n", 4, "queues[0].flavors[0].name"),
    ],
)
def test_mistakes_name_the_line_and_field(tmp_path: Path, text: str, line: int, field: str) -> None:
    path = tmp_path / "queues.yaml"
    path.write_text(text)
    with pytest.raises(InputFileError) as caught:
        load_queue_file(path)
    assert (caught.value.line, caught.value.field) == (line, field), str(caught.value)


def test_a_value_the_api_refuses_is_reported_before_anything_is_sent(tmp_path: Path) -> None:
    path = tmp_path / "queues.yaml"
    path.write_text(GOOD.replace("borrowingLimit: {gpus: 2}", "borrowingLimit: {gpus: -2}"))
    # No server listens on this port: the file is refused before the CLI tries to reach one.
    result = runner.invoke(app, ["queues", "apply", "-f", str(path), "--url", "http://127.0.0.1:9"])
    assert_one_line_error(result, f"{path}:9: queues[0].flavors[0].borrowingLimit.gpus:", "greater than or equal")


def test_bad_yaml_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "queues.yaml"
    path.write_text("queues:\n  - name: [a\n")
    assert_one_line_error(runner.invoke(app, ["queues", "apply", "-f", str(path)]), str(path))
