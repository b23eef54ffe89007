"""One served model inside the twin: its replica shape and timing, replicas, router, gateway queue and counters."""

from __future__ import annotations

import math

from tessera.serving.models import ModelSpec
from tessera.serving.policies.admission import RequestHeap
from tessera.serving.policies.engine_parts import IterationTimes
from tessera.serving.policies.router import RouterState, make_router
from tessera.serving.policies.slo_feedback import updated_footprint
from tessera.serving.setups import ReplicaSizing
from tessera.serving.sizing import ReplicaShape, concurrency_target
from tessera.sim.serving.fleet import Replica, ReplicaState
from tessera.sim.serving.interference import StepDemand

BUSY_GROW = 0.9  # replicas busy this share of the time (with a fair load) get a GPU of their own...
BUSY_SHRINK = 0.6  # ...until they are busy less than this


class ModelRuntime:
    """One served model's replicas, router and control state inside the twin."""

    def __init__(
        self,
        name: str,
        spec: ModelSpec,
        shapes: tuple[ReplicaShape, ...],
        demands: tuple[StepDemand, ...],
        perf: IterationTimes,
        router_name: str,
    ) -> None:
        self.name = name
        self.spec = spec
        self.shapes = shapes  # the replica sizes it may use, smallest first (``sizing.replica_shapes``)
        self.demands = demands  # what a busy replica of each size asks of its GPUs (``interference``)
        self.size = 0  # the size new replicas get
        self.load_ema = 0.0  # requests in flight, averaged over about a minute
        self.busy_ema = 0.0  # the share of its ready replicas busy at a tick, averaged likewise
        self.tokens_per_sequence: float | None = None  # mean KV footprint of its recent requests (``observe``)
        self.large_blocked_until_s = -math.inf  # no whole-GPU replica tried before then (none found room)
        self.perf = perf
        self.router = make_router(router_name)
        self.router_state: RouterState = self.router.initial_state()
        self.replicas: list[Replica] = []
        self.gateway = RequestHeap()  # requests the gateway holds until a replica has room (late binding)
        self.arrivals = 0  # since the last tick
        self.last_arrival_s = -math.inf

    def observe(self, prompt_tokens: int, predicted_output_tokens: int) -> None:
        """Learn the KV footprint of the model's requests (prompt + half a predicted answer), averaged over about
        the last hundred arrivals: replica targets follow what this model's traffic actually holds."""
        self.tokens_per_sequence = updated_footprint(self.tokens_per_sequence, prompt_tokens, predicted_output_tokens)

    @property
    def shape(self) -> ReplicaShape:
        return self.shapes[self.size]

    @property
    def demand(self) -> StepDemand:
        return self.demands[self.size]

    def choose_size(self, sizing: ReplicaSizing, now_s: float) -> None:
        """Whole-GPU replicas once the averaged load is over ``grow_at`` small replicas' worth, or its replicas are
        busy nearly all the time with a fair load (a replica that never idles gains nothing from a shared GPU and
        slows its neighbours all the time); small ones again under ``shrink_at`` with idle spells (the gap keeps a
        model from flapping between sizes); small ones while a whole-GPU replica recently found no room."""
        if len(self.shapes) == 1 or now_s < self.large_blocked_until_s:
            return
        small = concurrency_target(self.shapes[0], sizing, self.tokens_per_sequence)
        busy = self.busy_ema > BUSY_GROW and self.load_ema > 0.5 * small
        if self.size == 0 and (self.load_ema > sizing.grow_at * small or busy):
            self.size = len(self.shapes) - 1
        elif self.size > 0 and self.load_ema < sizing.shrink_at * small and self.busy_ema < BUSY_SHRINK:
            self.size = 0

    def ready(self) -> list[Replica]:
        return [r for r in self.replicas if r.state is ReplicaState.READY]

    def active(self) -> list[Replica]:
        return [r for r in self.replicas if r.state is not ReplicaState.DRAINING]
