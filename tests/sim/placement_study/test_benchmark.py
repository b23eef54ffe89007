"""``compare_placement``: several policies in lockstep, each deciding as it would alone."""

import hashlib

import numpy as np
import pytest

from tessera.core.placement import Placer
from tessera.core.workload import Placement, Request
from tessera.sim.placement_study import benchmark, digest
from tessera.sim.placement_study.inputs import default_inputs


def test_lockstep_decisions_are_those_of_a_run_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    inputs = default_inputs()
    hashes: dict[str, hashlib._Hash] = {}
    placed: dict[str, int] = {}

    class Recording(Placer):
        def decide(
            self, request: Request, rng: np.random.Generator, among: np.ndarray | None = None
        ) -> Placement | None:
            placement = super().decide(request, rng, among)
            name = self.policy.name
            h = hashes.setdefault(name, hashlib.sha256())
            if placement is None:
                h.update(b"-;")
            else:
                placed[name] = placed.get(name, 0) + 1
                h.update(f"{placement.node}:{','.join(map(str, placement.gpu_indices))};".encode())
            return placement

    monkeypatch.setattr(benchmark, "Placer", Recording)
    lines = benchmark.compare_placement(inputs, ["bestfit", "fgd"], seed=3)
    for name in ("bestfit", "fgd"):
        assert (hashes[name].hexdigest(), placed[name]) == digest.placement_digest(
            inputs.nodes, inputs.requests, name, seed=3
        )
    assert [line["policy"] for line in lines] == ["bestfit", "fgd"]
    assert lines[1]["pods_per_s_ratio"] == 1.0 and lines[0]["baseline"] == "fgd"


def test_the_baseline_must_be_measured() -> None:
    with pytest.raises(ValueError, match="tessera"):
        benchmark.compare_placement(default_inputs(), ["bestfit", "fgd"], baseline="tessera")
