"""The serving study's report: ``summary.json``, ``summary.md``, ``runs.csv``, ``gpus.png`` and ``ttft_cdf.png``.

``tessera simulate serving`` calls ``write_serving_report`` with the study's runs. ``summary.json`` follows the
issue's schema exactly: ``{"trace": str, "models": int, "seeds": [int], "policies": {NAME: {"gpu_hours",
"peak_gpus", "slo_attainment_pct", "worst_model_slo_attainment_pct", "ttft_p99_s", "tpot_p99_s", "requests",
"dropped", "cold_starts", "sim_wall_s"}}}``, each policy's entry from ``tessera.sim.serving.result.summarise``
(means over seeds; the worst, or the total, where the schema asks for an int). ``summary.md`` has the same figures
as a table, the study's settings, and each model's worst SLO attainment over seeds per policy; ``runs.csv`` one
row per (policy, seed). The plots show the first seed's GPUs in use over time per policy against the arrival rate
(twin axis), and the TTFT CDF per policy over all seeds (log x).
"""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from tessera.sim.serving.config import StudyConfig  # noqa: E402
from tessera.sim.serving.result import PolicyRun, summarise  # noqa: E402

SUMMARY_KEYS: tuple[str, ...] = (
    "gpu_hours",
    "peak_gpus",
    "slo_attainment_pct",
    "worst_model_slo_attainment_pct",
    "ttft_p99_s",
    "tpot_p99_s",
    "requests",
    "dropped",
    "cold_starts",
    "sim_wall_s",
)
_MD_HEADERS = (
    "GPU-hours",
    "peak GPUs",
    "SLO met %",
    "worst model SLO %",
    "TTFT p99 (s)",
    "TPOT p99 (s)",
    "requests",
    "dropped",
    "cold starts",
    "sim wall (s)",
)
_RUN_COLUMNS = ("policy", "seed", "gpus", *SUMMARY_KEYS)


def runs_by_policy(config: StudyConfig, runs: Sequence[PolicyRun]) -> dict[str, list[PolicyRun]]:
    """The runs grouped by policy: the config's policies first, in its order, then any other in first-seen order."""
    grouped: dict[str, list[PolicyRun]] = {name: [] for name in config.policies}
    for run in runs:
        grouped.setdefault(run.policy, []).append(run)
    return {name: sorted(group, key=lambda r: r.seed) for name, group in grouped.items() if group}


def summary_document(config: StudyConfig, trace_name: str, runs: Sequence[PolicyRun]) -> dict[str, object]:
    """The ``summary.json`` document."""
    return {
        "trace": trace_name,
        "models": config.models,
        "seeds": list(config.seeds),
        "policies": {name: summarise(group) for name, group in runs_by_policy(config, runs).items()},
    }


def write_serving_report(out: Path, config: StudyConfig, trace_name: str, runs: list[PolicyRun]) -> list[Path]:
    """Write the report's files into ``out`` (created if needed) and return their paths."""
    if not runs:
        raise ValueError("no runs to report")
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / name for name in ("summary.json", "summary.md", "runs.csv", "gpus.png", "ttft_cdf.png")]
    document = summary_document(config, trace_name, runs)
    paths[0].write_text(json.dumps(document, indent=2) + "\n")
    paths[1].write_text(summary_markdown(config, trace_name, runs))
    _write_runs_csv(paths[2], runs)
    _plot_gpus(paths[3], trace_name, config, runs)
    _plot_ttft_cdf(paths[4], trace_name, config, runs)
    return paths


def summary_markdown(config: StudyConfig, trace_name: str, runs: Sequence[PolicyRun]) -> str:
    grouped = runs_by_policy(config, runs)
    cluster = config.gpus or ("smallest meeting the SLOs" if config.gpus_for_slo else "sized by each policy")
    lines = [
        f"# Serving study: {trace_name}",
        "",
        f"{config.models} models, Zipf {config.zipf:g}, load {config.load:g}x, seeds "
        f"{', '.join(str(s) for s in config.seeds)}; cluster: {cluster}. Figures are means over seeds (peak GPUs "
        "and worst model SLO: the worst seed; dropped and cold starts: totals over seeds).",
        "",
        "| policy | " + " | ".join(_MD_HEADERS) + " |",
        "|---|" + "---:|" * len(_MD_HEADERS),
    ]
    for name, group in grouped.items():
        summary = summarise(group)
        lines.append(f"| {name} | " + " | ".join(_format(summary[key]) for key in SUMMARY_KEYS) + " |")
    lines += _model_table(grouped)
    return "\n".join(lines) + "\n"


def _format(value: float | int) -> str:
    return f"{value:,}" if isinstance(value, int) else f"{value:,.3f}"


def _model_table(grouped: dict[str, list[PolicyRun]]) -> list[str]:
    """Each model's worst SLO attainment over seeds, per policy (the models in the order of the first run)."""
    models: list[str] = []
    worst: dict[tuple[str, str], float] = {}
    for policy, group in grouped.items():
        for run in group:
            for outcome in run.models:
                if outcome.model not in models:
                    models.append(outcome.model)
                key = (policy, outcome.model)
                worst[key] = min(worst.get(key, 100.0), outcome.slo_attainment_pct)
    if not models:
        return []
    policies = list(grouped)
    lines = [
        "",
        "Worst SLO attainment (%) over seeds, per model:",
        "",
        "| model | " + " | ".join(policies) + " |",
        "|---|" + "---:|" * len(policies),
    ]
    for model in models:
        cells = [f"{worst[(p, model)]:.2f}" if (p, model) in worst else "-" for p in policies]
        lines.append(f"| {model} | " + " | ".join(cells) + " |")
    return lines


def _write_runs_csv(path: Path, runs: Sequence[PolicyRun]) -> None:
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(_RUN_COLUMNS)
        for run in runs:
            writer.writerow([getattr(run, column) for column in _RUN_COLUMNS])


def _first_seed_runs(config: StudyConfig, runs: Sequence[PolicyRun]) -> list[PolicyRun]:
    return [group[0] for group in runs_by_policy(config, runs).values()]


def _plot_gpus(path: Path, trace_name: str, config: StudyConfig, runs: Sequence[PolicyRun]) -> None:
    figure, axis = plt.subplots(figsize=(9, 4.5))
    rate_axis = axis.twinx()
    shown = _first_seed_runs(config, runs)
    for run in shown:
        if run.times_s.size:
            axis.step(run.times_s / 60.0, run.gpus_in_use, where="post", label=run.policy, linewidth=1.0)
    with_rate = next((r for r in shown if r.arrival_rate.size and r.arrival_rate.size == r.times_s.size), None)
    if with_rate is not None:
        # arrival_rate[i] is the rate over the interval that ends at times_s[i].
        rate_axis.step(
            with_rate.times_s / 60.0,
            with_rate.arrival_rate,
            where="pre",
            color="0.6",
            linewidth=0.7,
            label="arrival rate",
        )
    seed = shown[0].seed if shown else 0
    axis.set(xlabel="time (min)", ylabel="GPUs in use")
    axis.set_title(f"GPUs in use against the load: {trace_name}, seed {seed}")
    rate_axis.set_ylabel("arrivals per second")
    axis.grid(alpha=0.3)
    handles, labels = axis.get_legend_handles_labels()
    rate_handles, rate_labels = rate_axis.get_legend_handles_labels()
    axis.legend(handles + rate_handles, labels + rate_labels, loc="upper left")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _plot_ttft_cdf(path: Path, trace_name: str, config: StudyConfig, runs: Sequence[PolicyRun]) -> None:
    figure, axis = plt.subplots(figsize=(7, 4.2))
    for name, group in runs_by_policy(config, runs).items():
        ttft = np.sort(np.concatenate([r.ttft_s for r in group]))
        if ttft.size:
            axis.plot(np.maximum(ttft, 1e-3), np.arange(1, ttft.size + 1) / ttft.size, label=name)
    axis.set(xscale="log", xlabel="time to first token (s, log scale)", ylabel="fraction of served requests")
    axis.set_title(f"TTFT CDF: {trace_name}")
    axis.grid(alpha=0.3)
    if axis.get_legend_handles_labels()[0]:
        axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
