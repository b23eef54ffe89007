"""Run the arrival-inflation experiment for every (policy, seed) pair, in parallel over worker processes.

Called by the CLI (``tessera simulate fgd``), the benchmarks and the tests. Each worker process receives the nodes
and the requests once, through the pool initializer, and then runs one (policy, seed) per task; only the small
bucketed curves travel back. With ``jobs == 1`` everything runs in this process, without a pool.

``parse_policies`` and ``parse_seeds`` turn the command line's spellings into checked values, so that a bad name
or range fails before any run starts.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from typing import NamedTuple

from tessera.core.cluster import NodeSpec
from tessera.core.errors import InvalidRequestError
from tessera.core.placement import SETUP_NAMES
from tessera.core.workload import Request
from tessera.sim.placement_study.inflation import BucketCurves, RunSamples, bucketize, run_inflation

# Relative cost of one run per policy (measured on the openb default trace); the dearest start first.
_POLICY_COST: dict[str, int] = {
    "tessera-online": 12,
    "tessera": 12,
    "fgd": 10,
    "bestfit": 2,
    "packing": 2,
    "clustering": 2,
    "dotprod": 2,
    "random": 1,
}

MAX_INFLATE = 10.0  # beyond this the arrival sequence only grows, the curves stop at 130%

OnDone = Callable[[str, int], None]


class RunResult(NamedTuple):
    """One (policy, seed) run, reduced to what reports need."""

    policy: str
    seed: int
    curves: BucketCurves  # per arrived-% bucket 0..130
    pods_per_s: float  # arrivals / total decision seconds
    arrivals: int  # pods that arrived (inflated sequence length)


def parse_policies(text: str, option: str = "--policies") -> list[str]:
    """Policy names from ``"fgd,bestfit"``; raises ``InvalidRequestError`` for an unknown or repeated name."""
    names = [part.strip().lower() for part in text.split(",") if part.strip()]
    if not names:
        raise InvalidRequestError(option, "no policy given")
    for name in names:
        if name not in SETUP_NAMES:
            raise InvalidRequestError(option, f"unknown policy {name!r} (known: {', '.join(SETUP_NAMES)})")
    if len(set(names)) != len(names):
        raise InvalidRequestError(option, f"a policy is named twice in {text!r}")
    return names


def parse_seeds(text: str) -> list[int]:
    """Seeds from ``"42-51"`` (inclusive), ``"42,43,50"`` or ``"7"``; raises ``InvalidRequestError``."""
    seeds: list[int] = []
    for part in (p.strip() for p in text.split(",")):
        low, dash, high = part.partition("-")
        try:
            first = int(low)
            last = int(high) if dash else first
        except ValueError:
            raise InvalidRequestError("--seeds", f"{text!r} is not a seed, a range like 42-51 or a list") from None
        if first < 0 or last < first:
            raise InvalidRequestError("--seeds", f"bad seed range {part!r} (seeds are >= 0, low-high)")
        seeds.extend(range(first, last + 1))
    if len(set(seeds)) != len(seeds):
        raise InvalidRequestError("--seeds", f"a seed appears twice in {text!r}")
    return seeds


def check_inflate(inflate: float) -> None:
    """Raise ``InvalidRequestError`` unless ``inflate`` is a usable arrival-inflation factor."""
    if not 0 < inflate <= MAX_INFLATE:
        raise InvalidRequestError("--inflate", f"must be > 0 and <= {MAX_INFLATE:g}, got {inflate:g}")


def result_of(samples: RunSamples) -> RunResult:
    """The report-sized summary of one run."""
    total_s = float(samples.decision_s.sum())
    pods_per_s = samples.arrivals / total_s if total_s > 0 else 0.0
    return RunResult(samples.policy, samples.seed, bucketize(samples), pods_per_s, samples.arrivals)


def run_sweep(
    nodes: Sequence[NodeSpec],
    requests: Sequence[Request],
    policies: Sequence[str],
    seeds: Sequence[int],
    inflate: float = 1.3,
    jobs: int = 1,
    on_done: OnDone | None = None,
) -> list[RunResult]:
    """Every (policy, seed) run, sorted by the order of ``policies`` and then by seed.

    ``on_done(policy, seed)`` is called in this process as each run finishes (for progress bars).
    """
    if jobs < 1:
        raise InvalidRequestError("--jobs", f"must be >= 1, got {jobs}")
    check_inflate(inflate)
    tasks = _ordered_tasks(policies, seeds)
    if jobs == 1 or len(tasks) <= 1:
        results = _run_in_process(nodes, requests, tasks, inflate, on_done)
    else:
        results = _run_in_pool(nodes, requests, tasks, inflate, min(jobs, len(tasks)), on_done)
    rank = {name: i for i, name in enumerate(policies)}
    return sorted(results, key=lambda r: (rank[r.policy], r.seed))


def _ordered_tasks(policies: Sequence[str], seeds: Sequence[int]) -> list[tuple[str, int]]:
    """All (policy, seed) pairs, dearest policy first so the slowest runs do not trail at the end."""
    pairs = [(policy, seed) for policy in policies for seed in seeds]
    return sorted(pairs, key=lambda pair: -_POLICY_COST.get(pair[0], 1))  # stable: keeps the given order otherwise


def _run_in_process(
    nodes: Sequence[NodeSpec],
    requests: Sequence[Request],
    tasks: Sequence[tuple[str, int]],
    inflate: float,
    on_done: OnDone | None,
) -> list[RunResult]:
    results = []
    for policy, seed in tasks:
        results.append(result_of(run_inflation(nodes, requests, policy, seed, inflate)))
        if on_done is not None:
            on_done(policy, seed)
    return results


def _run_in_pool(
    nodes: Sequence[NodeSpec],
    requests: Sequence[Request],
    tasks: Sequence[tuple[str, int]],
    inflate: float,
    jobs: int,
    on_done: OnDone | None,
) -> list[RunResult]:
    # "spawn": workers start clean (no inherited threads such as a progress bar's), on every platform alike.
    context = multiprocessing.get_context("spawn")
    results: list[RunResult] = []
    with ProcessPoolExecutor(
        max_workers=jobs, mp_context=context, initializer=_init_worker, initargs=(list(nodes), list(requests))
    ) as pool:
        futures: dict[Future[RunResult], tuple[str, int]] = {
            pool.submit(_run_task, policy, seed, inflate): (policy, seed) for policy, seed in tasks
        }
        for future in as_completed(futures):
            results.append(future.result())
            if on_done is not None:
                on_done(*futures[future])
    return results


# The inputs of this worker process, set once by the pool initializer (only ever set inside pool workers).
_worker_inputs: tuple[list[NodeSpec], list[Request]] | None = None


def _init_worker(nodes: list[NodeSpec], requests: list[Request]) -> None:
    global _worker_inputs
    _worker_inputs = (nodes, requests)


def _run_task(policy: str, seed: int, inflate: float) -> RunResult:
    assert _worker_inputs is not None, "worker used before its initializer ran"
    nodes, requests = _worker_inputs
    return result_of(run_inflation(nodes, requests, policy, seed, inflate))
