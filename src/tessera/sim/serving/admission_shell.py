"""The twin's side of admission: the load a model is under when a request arrives (placeholder until the pure
admission policy lands)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tessera.serving.policies.requests import InferenceRequest, SloClass, SloTarget

if TYPE_CHECKING:
    from tessera.sim.serving.twin import ModelRuntime


class Admission:
    def __init__(self, targets: dict[SloClass, SloTarget]) -> None:
        self.targets = targets

    def shed_reason(self, request: InferenceRequest, m: ModelRuntime, now_s: float) -> str:
        return ""
