"""Co-location physics: the speed factor of training jobs sharing a GPU, and which jobs a join or leave affects."""

import pytest

from tessera.core.throughput import ColocationModel
from tessera.sim.replay.colocation import SharedGpus

MODEL = ColocationModel(
    {
        ("ResNet-50", "A3C", "V100M16"): (0.85, 0.80),
        ("ResNet-50", "ResNet-50", "V100M16"): (0.48, 0.48),
        ("A3C", "A3C", "V100M16"): (0.9, 0.9),
    }
)


def test_a_job_alone_runs_at_its_isolated_speed_and_a_pair_at_the_measured_factors() -> None:
    gpus = SharedGpus(MODEL)
    assert gpus.join(1, "ResNet-50", (0, 0), "V100M16") == [1]
    assert gpus.factor(1) == 1.0
    assert sorted(gpus.join(2, "A3C", (0, 0), "V100M16")) == [1, 2]
    assert gpus.factor(1) == 0.85 and gpus.factor(2) == 0.80  # each side of the pair its own factor


def test_leaving_restores_the_partner_and_reports_it() -> None:
    gpus = SharedGpus(MODEL)
    gpus.join(1, "ResNet-50", (0, 0), "V100M16")
    gpus.join(2, "A3C", (0, 0), "V100M16")
    gpus.join(3, "A3C", (0, 1), "V100M16")  # another GPU: unaffected throughout
    assert gpus.leave(2) == [1]
    assert gpus.factor(1) == 1.0 and gpus.factor(3) == 1.0
    assert gpus.leave(2) == [] and gpus.leave(99) == []  # leaving twice, or never having joined, changes nothing


def test_three_jobs_on_one_gpu_compound_their_pairwise_slowdowns() -> None:
    gpus = SharedGpus(MODEL)
    for job, job_type in ((1, "ResNet-50"), (2, "A3C"), (3, "A3C")):
        gpus.join(job, job_type, (0, 0), "V100M16")
    assert gpus.factor(1) == pytest.approx(0.85 * 0.85)
    assert gpus.factor(2) == pytest.approx(0.80 * 0.9)


def test_a_job_cannot_join_twice() -> None:
    gpus = SharedGpus(MODEL)
    gpus.join(1, "A3C", (0, 0), "V100M16")
    with pytest.raises(ValueError, match="already"):
        gpus.join(1, "A3C", (0, 1), "V100M16")


def test_a_pair_that_cannot_run_together_stops_the_later_job_until_the_earlier_leaves() -> None:
    gpus = SharedGpus(ColocationModel({("CycleGAN", "ResNet-50", "K80"): (0.0, 0.0)}))
    gpus.join(1, "ResNet-50", (0, 0), "K80")
    gpus.join(2, "CycleGAN", (0, 0), "K80")
    assert gpus.factor(1) == 1.0 and gpus.factor(2) == 0.0
    assert gpus.leave(1) == [2] and gpus.factor(2) == 1.0
