"""The ``tessera`` command line, run in-process with typer's CliRunner (no subprocess)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from cli_checks import assert_one_line_error
from typer.testing import CliRunner

from tessera.cli.main import app
from tessera.sim.traces.openb import write_nodes_csv, write_pods_csv
from tessera.sim.workloads.synthetic import synthetic_nodes, synthetic_pods

runner = CliRunner()

NODES_CSV = """sn,cpu_milli,memory_mib,gpu,model
node-a,96000,393216,8,G2
node-b,32000,131072,2,T4
"""
POD_HEADER = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time"
)
POD_ROWS = [
    "pod-0,4000,8192,1,500,,LS,Running,0,100,0",
    "pod-1,8000,16384,1,1000,G2,BE,Running,10,200,10",
    "pod-2,2000,4096,0,0,,LS,Running,20,300,20",
]


@pytest.fixture(scope="module")
def small_trace(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("trace")
    nodes = synthetic_nodes(num_nodes=24, seed=3)
    nodes_path, pods_path = folder / "nodes.csv", folder / "pods.csv"
    write_nodes_csv(nodes, nodes_path)
    write_pods_csv(synthetic_pods(num_pods=160, seed=3, nodes=nodes), pods_path)
    return nodes_path, pods_path


def _write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(text, encoding="utf-8")
    return path


def _pods_text(edit: Callable[[list[str]], list[str]] = lambda lines: lines) -> str:
    return "\n".join(edit([POD_HEADER, *POD_ROWS])) + "\n"


def _replace_row(index: int, row: str) -> Callable[[list[str]], list[str]]:
    def edit(lines: list[str]) -> list[str]:
        lines = list(lines)
        lines[index] = row
        return lines

    return edit


def test_simulate_fgd_writes_the_report(small_trace: tuple[Path, Path], tmp_path: Path) -> None:
    nodes, pods = small_trace
    out = tmp_path / "report"
    args = ["simulate", "fgd", "--nodes", str(nodes), "--pods", str(pods), "--policies", "bestfit,fgd"]
    result = runner.invoke(app, [*args, "--seeds", "1-2", "--jobs", "1", "--out", str(out)])

    assert result.exit_code == 0, result.output
    for name in ("runs.csv", "summary.json", "summary.md", "unallocated.png"):
        assert (out / name).is_file(), name
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary) == {"trace", "gpus", "seeds", "policies"}
    assert summary["trace"] == "pods"
    assert isinstance(summary["gpus"], int) and summary["gpus"] > 0
    assert summary["seeds"] == [1, 2]
    assert list(summary["policies"]) == ["bestfit", "fgd"]
    for figures in summary["policies"].values():
        assert set(figures) == {"unallocated_pct", "unallocated_pct_std", "pods_per_s"}
        for key in ("unallocated_pct", "unallocated_pct_std"):
            assert set(figures[key]) == {"100", "130"}
            assert all(isinstance(v, float) for v in figures[key].values())
        assert isinstance(figures["pods_per_s"], float) and figures["pods_per_s"] > 0
    assert "fgd" in result.stdout and "summary.json" in result.stdout
    assert len((out / "runs.csv").read_text().splitlines()) == 1 + 2 * 2 * 131


def test_bench_placement_prints_one_json_line(small_trace: tuple[Path, Path]) -> None:
    nodes, pods = small_trace
    result = runner.invoke(app, ["bench", "placement", "--nodes", str(nodes), "--pods", str(pods), "--policy", "fgd"])

    assert result.exit_code == 0, result.output
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 1
    line = json.loads(lines[0])
    assert set(line) == {"policy", "nodes", "pods", "pods_per_s", "p99_decision_ms"}
    assert line["policy"] == "fgd" and line["nodes"] == 24 and line["pods"] >= 160
    assert isinstance(line["pods_per_s"], float) and isinstance(line["p99_decision_ms"], float)


COMPARISON_KEYS = {
    "policy",
    "nodes",
    "pods",
    "pods_per_s",
    "p50_decision_ms",
    "p99_decision_ms",
    "setup_ms",
    "baseline",
    "pods_per_s_ratio",
}


def test_bench_placement_of_several_policies_prints_a_line_each_with_the_ratio_to_the_last(
    small_trace: tuple[Path, Path],
) -> None:
    nodes, pods = small_trace
    args = ["bench", "placement", "--nodes", str(nodes), "--pods", str(pods)]
    result = runner.invoke(app, [*args, "--policy", "bestfit,fgd"])

    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.stdout.strip().splitlines()]
    assert [line["policy"] for line in lines] == ["bestfit", "fgd"]
    for line in lines:
        assert set(line) == COMPARISON_KEYS
        assert line["nodes"] == 24 and line["pods"] == lines[0]["pods"] >= 160
        assert line["baseline"] == "fgd"
        assert 0 < line["p50_decision_ms"] <= line["p99_decision_ms"]
        assert line["setup_ms"] >= 0
    fgd, bestfit = lines[1], lines[0]
    assert fgd["pods_per_s_ratio"] == 1.0
    assert bestfit["pods_per_s_ratio"] == pytest.approx(bestfit["pods_per_s"] / fgd["pods_per_s"], rel=1e-2)


def test_bench_placement_takes_policies_and_a_baseline(small_trace: tuple[Path, Path]) -> None:
    nodes, pods = small_trace
    args = ["bench", "placement", "--nodes", str(nodes), "--pods", str(pods), "--policies", "fgd,bestfit"]
    result = runner.invoke(app, [*args, "--baseline", "FGD"])

    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.stdout.strip().splitlines()]
    assert [(line["policy"], line["baseline"]) for line in lines] == [("fgd", "fgd"), ("bestfit", "fgd")]
    assert lines[0]["pods_per_s_ratio"] == 1.0


def test_bench_placement_refuses_a_baseline_it_does_not_measure(small_trace: tuple[Path, Path]) -> None:
    nodes, pods = small_trace
    args = ["bench", "placement", "--nodes", str(nodes), "--pods", str(pods), "--policy", "fgd,bestfit"]
    assert_one_line_error(runner.invoke(app, [*args, "--baseline", "tessera"]), "--baseline", "tessera")
    result = runner.invoke(app, ["bench", "placement", "--policy", "fgd,fgd"])
    assert_one_line_error(result, "--policy", "twice")


# (case id, node list text, pod list text, file named in the message, expected fragments of the message)
BAD_FILES = [
    (
        "missing column",
        NODES_CSV,
        _pods_text(lambda ls: [ls[0].replace(",gpu_milli", ""), *ls[1:]]),
        "pods.csv",
        [":1", "gpu_milli"],
    ),
    (
        "non-numeric",
        NODES_CSV,
        _pods_text(_replace_row(2, "pod-1,lots,16384,1,1000,,BE,Running,10,200,10")),
        "pods.csv",
        [":3", "cpu_milli"],
    ),
    (
        "negative",
        NODES_CSV,
        _pods_text(_replace_row(1, "pod-0,4000,-5,1,500,,LS,Running,0,100,0")),
        "pods.csv",
        [":2", "memory_mib"],
    ),
    (
        "gpu_milli over 1000",
        NODES_CSV,
        _pods_text(_replace_row(1, "pod-0,4000,8192,1,1500,,LS,Running,0,100,0")),
        "pods.csv",
        [":2", "gpu_milli"],
    ),
    (
        "unknown gpu type",
        NODES_CSV,
        _pods_text(_replace_row(3, "pod-2,2000,4096,1,1000,Z9000,LS,Running,20,300,20")),
        "pods.csv",
        [":4", "gpu_spec"],
    ),
    (
        "num_gpu over any node",
        NODES_CSV,
        _pods_text(_replace_row(2, "pod-1,8000,16384,16,1000,,BE,Running,10,200,10")),
        "pods.csv",
        [":3", "num_gpu"],
    ),
    ("empty pod file", NODES_CSV, "", "pods.csv", ["empty"]),
    ("bad node model", NODES_CSV.replace(",T4", ",Q7"), _pods_text(), "nodes.csv", [":3", "model"]),
    ("non-numeric node gpu", NODES_CSV.replace(",8,G2", ",eight,G2"), _pods_text(), "nodes.csv", [":2", "gpu"]),
]


@pytest.mark.parametrize(
    ("nodes_text", "pods_text", "named", "fragments"),
    [case[1:] for case in BAD_FILES],
    ids=[case[0] for case in BAD_FILES],
)
def test_bad_input_files_give_one_line_and_exit_2(
    tmp_path: Path, nodes_text: str, pods_text: str, named: str, fragments: list[str]
) -> None:
    nodes = _write(tmp_path, "nodes.csv", nodes_text)
    pods = _write(tmp_path, "pods.csv", pods_text)
    args = ["--nodes", str(nodes), "--pods", str(pods)]
    result = runner.invoke(app, ["simulate", "fgd", *args, "--jobs", "1", "--seeds", "1", "--out", str(tmp_path / "o")])
    assert_one_line_error(result, str(tmp_path / named), *fragments)
    result = runner.invoke(app, ["bench", "placement", *args, "--policy", "bestfit"])
    assert_one_line_error(result, str(tmp_path / named), *fragments)


def test_missing_file_names_the_path(tmp_path: Path) -> None:
    nodes = _write(tmp_path, "nodes.csv", NODES_CSV)
    missing = tmp_path / "nowhere.csv"
    result = runner.invoke(
        app, ["bench", "placement", "--nodes", str(nodes), "--pods", str(missing), "--policy", "fgd"]
    )
    assert_one_line_error(result, str(missing))


def test_unknown_policy_fails_before_any_run(tmp_path: Path) -> None:
    out = tmp_path / "o"
    result = runner.invoke(app, ["simulate", "fgd", "--policies", "fgd,tetris", "--out", str(out)])
    assert_one_line_error(result, "tetris", "--policies")
    assert not out.exists()
    result = runner.invoke(app, ["bench", "placement", "--policy", "tetris"])
    assert_one_line_error(result, "tetris")


@pytest.mark.parametrize("seeds", ["a-b", "5-3", "1,,2", "-4"])
def test_bad_seeds_fail(tmp_path: Path, seeds: str) -> None:
    result = runner.invoke(app, ["simulate", "fgd", "--seeds", seeds, "--out", str(tmp_path / "o")])
    assert_one_line_error(result, "--seeds")


def test_nodes_without_pods_is_an_error(tmp_path: Path) -> None:
    nodes = _write(tmp_path, "nodes.csv", NODES_CSV)
    result = runner.invoke(app, ["simulate", "fgd", "--nodes", str(nodes), "--out", str(tmp_path / "o")])
    assert_one_line_error(result, str(nodes), "--pods")


def test_simulate_timeline_tenants_writes_the_four_files(tmp_path: Path) -> None:
    out = tmp_path / "tenants"
    result = runner.invoke(
        app, ["simulate", "timeline", "--workload", "tenants", "--policies", "tessera", "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.iterdir()) == ["allocation.png", "jct_cdf.png", "summary.json", "summary.md"]
    assert "team-a" in (out / "summary.md").read_text()


def _queues_json(**team_b: object) -> str:
    queues = [{"name": "team-a", "cohort": "org", "nominal_gpus": 48}, {"name": "team-b", "cohort": "org", **team_b}]
    return json.dumps({"queues": queues})


def _jobs_json(**job: object) -> str:
    base = {"id": "j1", "arrival_s": 0, "duration_s": 600, "queue": "team-a", "priority_class": "training"}
    return json.dumps({"jobs": [{**base, **job}]})


@pytest.mark.parametrize(
    ("queues", "jobs", "fragments"),
    [
        (_queues_json(nominal_gpus=-4), None, ["queues.json", "nominal_gpu_milli", "< 0"]),
        (
            json.dumps({"queues": [{"name": "alone", "cohort": None, "nominal_gpus": 8, "borrowing_limit_gpus": 8}]}),
            None,
            ["queues.json", "borrowing", "needs a cohort"],
        ),
        (_queues_json(nominal_gpus=48), _jobs_json(priority_class="urgent"), ["jobs.json", "unknown priority class"]),
        (_queues_json(nominal_gpus=48), _jobs_json(gang=200), ["jobs.json", "gang", "larger than the cluster"]),
    ],
    ids=["negative-quota", "borrowing-without-cohort", "unknown-priority-class", "gang-larger-than-cluster"],
)
def test_simulate_timeline_bad_queue_and_job_files_fail_with_one_line(
    tmp_path: Path, queues: str, jobs: str | None, fragments: list[str]
) -> None:
    args = ["simulate", "timeline", "--workload", "tenants", "--out", str(tmp_path / "o")]
    args += ["--queues", str(_write(tmp_path, "queues.json", queues))]
    if jobs is not None:
        args += ["--jobs", str(_write(tmp_path, "jobs.json", jobs))]
    assert_one_line_error(runner.invoke(app, args), *fragments)


def test_simulate_timeline_reads_queues_and_jobs_from_files(tmp_path: Path) -> None:
    jobs = [
        {"id": f"a{i}", "arrival_s": 0, "duration_s": 600, "queue": "team-a", "gang": 8, "checkpointed": True}
        for i in range(12)
    ] + [{"id": "b0", "arrival_s": 60, "duration_s": 600, "queue": "team-b", "gang": 8, "priority_class": "training"}]
    queue_file = _write(tmp_path, "queues.json", _queues_json(nominal_gpus=48))
    job_file = _write(tmp_path, "jobs.json", json.dumps({"jobs": jobs}))
    out = tmp_path / "o"
    args = ["simulate", "timeline", "--workload", "tenants", "--policies", "tessera", "--out", str(out)]
    result = runner.invoke(app, [*args, "--queues", str(queue_file), "--jobs", str(job_file)])
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["policies"]["tessera"]["preemptions"] == 1  # team-b reclaims one gang of 8 from team-a
