"""The scheduling step: ordering, strict FIFO vs backfill, gangs all or nothing, and a side-effect-free plan."""

import numpy as np

from tessera.core.cluster import ClusterState, NodeSpec
from tessera.core.placement import Placer, make_policy
from tessera.core.scheduler import PendingWorkload, QueueDiscipline, Scheduler, SchedulerConfig
from tessera.core.workload import Request

BIG = Request(num_gpus=4, gpu_milli=1000, cpu_milli=1000)
SMALL = Request(num_gpus=1, gpu_milli=500, cpu_milli=1000)


def scheduler(discipline: QueueDiscipline) -> Scheduler:
    state = ClusterState([NodeSpec("a", 32_000, 65_536, 2, "T4"), NodeSpec("b", 32_000, 65_536, 2, "T4")])
    return Scheduler(Placer(state, make_policy("bestfit")), SchedulerConfig(discipline=discipline))


def pending() -> list[PendingWorkload]:
    return [
        PendingWorkload("late-small", SMALL, arrival_s=5.0),
        PendingWorkload("early-big", BIG, arrival_s=1.0),
        PendingWorkload("urgent", SMALL, arrival_s=9.0, priority=10),
    ]


def test_strict_fifo_blocks_behind_a_head_that_does_not_fit() -> None:
    plan = scheduler(QueueDiscipline.STRICT_FIFO).plan(pending(), np.random.default_rng(0))
    assert [b.workload_id for b in plan.binds] == ["urgent"]  # priority first, then the big head blocks
    assert plan.waiting["late-small"] == "waiting behind an earlier workload"
    assert "4 free GPUs" in plan.waiting["early-big"]


def test_backfill_lets_later_workloads_that_fit_start() -> None:
    plan = scheduler(QueueDiscipline.BEST_EFFORT_FIFO).plan(pending(), np.random.default_rng(0))
    assert [b.workload_id for b in plan.binds] == ["urgent", "late-small"]


def test_a_gang_is_placed_whole_or_not_at_all_and_plan_leaves_the_state_untouched() -> None:
    engine = scheduler(QueueDiscipline.BEST_EFFORT_FIFO)
    before = engine.state.gpu_free_milli.copy()
    whole = Request(num_gpus=1, gpu_milli=1000, cpu_milli=1000)
    plan = engine.plan(
        [PendingWorkload("gang-of-5", whole, 0.0, gang=5), PendingWorkload("gang-of-3", whole, 1.0, gang=3)],
        np.random.default_rng(0),
    )
    assert [(b.workload_id, len(b.placements)) for b in plan.binds] == [("gang-of-3", 3)]
    assert "each of 5 workers" in plan.waiting["gang-of-5"]
    assert np.array_equal(before, engine.state.gpu_free_milli)
    nodes_used = {p.node for p in plan.binds[0].placements}
    assert len(nodes_used) == 2  # 3 whole GPUs need both 2-GPU nodes; no GPU is used twice
    gpus = [(p.node, p.gpu_indices) for p in plan.binds[0].placements]
    assert len(set(gpus)) == 3
