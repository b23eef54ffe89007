"""One served model inside the twin: its replica shape and timing, replicas, router, gateway queue and counters."""

from __future__ import annotations

import math

from tessera.serving.models import ModelSpec
from tessera.serving.policies.admission import RequestHeap
from tessera.serving.policies.engine_parts import IterationTimes
from tessera.serving.policies.router import RouterState, make_router
from tessera.sim.serving.fleet import Replica, ReplicaState
from tessera.sim.serving.sizing import ReplicaShape


class ModelRuntime:
    """One served model's replicas, router and control state inside the twin."""

    def __init__(self, name: str, spec: ModelSpec, shape: ReplicaShape, perf: IterationTimes, router_name: str) -> None:
        self.name = name
        self.spec = spec
        self.shape = shape
        self.perf = perf
        self.router = make_router(router_name)
        self.router_state: RouterState = self.router.initial_state()
        self.replicas: list[Replica] = []
        self.gateway = RequestHeap()  # requests the gateway holds until a replica has room (late binding)
        self.intensity = 1.0  # the share of a decode step its replicas saturate a GPU (``interference``)
        self.arrivals = 0  # since the last tick
        self.last_arrival_s = -math.inf

    def ready(self) -> list[Replica]:
        return [r for r in self.replicas if r.state is ReplicaState.READY]

    def active(self) -> list[Replica]:
        return [r for r in self.replicas if r.state is not ReplicaState.DRAINING]
