"""Diagnostic: training avg JCT when a checkpointed job resumes with its remaining WORK instead of its remaining time.

Usage: python bench/timeline_restart_work.py [--seeds 0,1,2] [--policies tessera-rigid,tessera,tiresias]

The timeline replay keeps a preempted, checkpointed job's remaining *time* (computed on the GPU model of its first
run), also when it restarts on a faster or slower model: a job's runtime is fixed by where it first starts. This
script patches the replay (here only) so that it keeps the remaining fraction of the work instead, and prints avg
and median JCT per (seed, policy); it shows how much of a difference between two policies comes from that rule.
Not a change to the simulator: docs/scheduling-over-time.md ("Elastic jobs") uses it to explain training seed 1.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from tessera.core.scheduler import Bind, Preempt
from tessera.sim import timeline
from tessera.sim.events import EventLoop
from tessera.sim.timeline_inputs import timeline_inputs

TRACES = Path(__file__).resolve().parents[1].parent / "shared" / "traces"


def patch_restart_keeps_work() -> None:
    replay = timeline._Replay
    fraction: dict[tuple[int, int], float] = {}
    preempt, start = replay._preempt, replay._start

    def _preempt(self: timeline._Replay, now: float, decision: Preempt) -> None:
        i = int(decision.workload_id)
        full = self._duration(i, self.placements[i])  # the whole gang's runtime on the model it ran on
        preempt(self, now, decision)
        if i in self.remaining_s and full > 0:
            fraction[(id(self), i)] = self.remaining_s[i] / full

    def _start(self: timeline._Replay, loop: EventLoop[timeline.Event], now: float, bind: Bind) -> None:
        i = int(bind.workload_id)
        left = fraction.pop((id(self), i), None)
        if left is not None and i in self.remaining_s:
            self.remaining_s[i] = left * self._duration(i, bind.placements)
        start(self, loop, now, bind)

    replay._preempt = _preempt  # type: ignore[method-assign]
    replay._start = _start  # type: ignore[method-assign]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--policies", default="tessera-rigid,tessera,tiresias")
    parser.add_argument("--traces", type=Path, default=TRACES)
    args = parser.parse_args()
    patch_restart_keeps_work()
    for seed in (int(s) for s in args.seeds.split(",")):
        inputs = timeline_inputs("training", None, None, None, seed, args.traces)
        for policy in args.policies.split(","):
            r = timeline.run_timeline(inputs.nodes, inputs.jobs, policy, seed, inputs.throughput, inputs.queues)
            jct = r.jct_s / 3600.0
            print(f"seed {seed} {policy}: avg JCT {np.mean(jct):.4f} h, median {np.median(jct):.3f} h", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
