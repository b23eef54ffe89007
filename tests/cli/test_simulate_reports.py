"""What ``tessera simulate`` prints and plots by default (issue 15, part 4): Tessera's own policy in the FGD study's
default set (what ``make simulate`` runs), the zoomed FGD plot, and the rich table of ``simulate timeline``."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tessera.cli.main import app
from tessera.sim.traces.openb import write_nodes_csv, write_pods_csv
from tessera.sim.workloads.synthetic import synthetic_nodes, synthetic_pods

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def small_trace(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("trace")
    nodes = synthetic_nodes(num_nodes=24, seed=3)
    nodes_path, pods_path = folder / "nodes.csv", folder / "pods.csv"
    write_nodes_csv(nodes, nodes_path)
    write_pods_csv(synthetic_pods(num_pods=160, seed=3, nodes=nodes), pods_path)
    return nodes_path, pods_path


def test_simulate_fgd_runs_tessera_by_default_as_make_simulate_does(
    small_trace: tuple[Path, Path], tmp_path: Path
) -> None:
    make = subprocess.run(["make", "-n", "simulate"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert "tessera simulate fgd --out" in make.stdout and "--policies" not in make.stdout  # the default set
    nodes, pods = small_trace
    out = tmp_path / "o"
    args = ["simulate", "fgd", "--nodes", str(nodes), "--pods", str(pods), "--seeds", "1-2", "--jobs", "1"]
    result = runner.invoke(app, [*args, "--out", str(out)])
    assert result.exit_code == 0, result.output
    policies = list(json.loads((out / "summary.json").read_text())["policies"])
    assert policies == ["random", "dotprod", "clustering", "packing", "bestfit", "fgd", "tessera"]
    assert re.search(r"│ tessera\s+│", result.stdout)


def test_simulate_timeline_prints_a_table_with_the_summary_columns(tmp_path: Path) -> None:
    queues = [{"name": team, "cohort": "org", "nominal_gpus": 48} for team in ("team-a", "team-b")]
    jobs = [
        {"id": f"a{i}", "arrival_s": 60 * i, "duration_s": 600, "queue": "team-a", "gang": 8, "checkpointed": True}
        for i in range(12)
    ] + [{"id": "b0", "arrival_s": 60, "duration_s": 600, "queue": "team-b", "gang": 8, "priority_class": "training"}]
    (tmp_path / "queues.json").write_text(json.dumps({"queues": queues}))
    (tmp_path / "jobs.json").write_text(json.dumps({"jobs": jobs}))
    out = tmp_path / "tenants"
    args = ["simulate", "timeline", "--workload", "tenants", "--policies", "static,tessera", "--out", str(out)]
    args += ["--queues", str(tmp_path / "queues.json"), "--jobs", str(tmp_path / "jobs.json")]
    result = runner.invoke(app, args, env={"COLUMNS": "220"})
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    header = next(line for line in lines if "avg JCT (h)" in line)
    for column in ("policy", "p50 JCT (h)", "p99 wait (h)", "GPU alloc %", "jobs / h", "makespan (h)", "Jain"):
        assert column in header
    makespan_h = json.loads((out / "summary.json").read_text())["policies"]["tessera"]["makespan_s"] / 3600
    tessera_row = next(line for line in lines if re.match(r"│ tessera\s+│", line))
    assert f"{makespan_h:.1f}" in tessera_row  # the table's figures are the summary's
    assert any("team-a" in line and "reclaims" in line for line in lines)  # the queue table
    assert "|---|" not in result.stdout  # no Markdown dumped on the terminal any more


def test_simulate_timeline_runs_a_named_placement_as_tessera_up_does_and_refuses_an_unknown_one(
    tmp_path: Path,
) -> None:
    jobs = [{"id": f"j{i}", "arrival_s": 30 * i, "duration_s": 300, "queue": "team-a", "gang": 1} for i in range(6)]
    (tmp_path / "jobs.json").write_text(json.dumps({"jobs": jobs}))
    (tmp_path / "queues.json").write_text(json.dumps({"queues": [{"name": "team-a", "nominal_gpus": 8}]}))
    base = ["simulate", "timeline", "--workload", "tenants", "--policies", "tessera"]
    base += ["--jobs", str(tmp_path / "jobs.json"), "--queues", str(tmp_path / "queues.json")]
    result = runner.invoke(app, [*base, "--placement", "packing", "--out", str(tmp_path / "p")])
    assert result.exit_code == 0, result.output
    assert list(json.loads((tmp_path / "p" / "summary.json").read_text())["policies"]) == ["tessera+packing"]
    wrong = runner.invoke(app, [*base, "--placement", "nope", "--out", str(tmp_path / "q")])
    assert wrong.exit_code == 2 and "--placement: unknown placement 'nope'" in wrong.output
    assert len(wrong.output.strip().splitlines()) == 1
