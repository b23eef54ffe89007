"""``GET /v1/config``: the scheduler this server runs (its preset, the placement in effect and every knob of the
preset), named as ``tessera simulate`` names them, so that a user can replay their workload in the twin with the
very configuration the cluster runs. Any valid token may read it: it holds nothing of any tenant's."""

from __future__ import annotations

from fastapi import APIRouter

from tessera.api import SchedulingOut, ServingSetupOut
from tessera.core.placement import PLACEMENTS
from tessera.core.preset_knobs import KNOBS
from tessera.core.presets import PRESET_NAMES
from tessera.server.api.routes import Caller
from tessera.server.context import ServerContext
from tessera.serving.setups import SETUP_KNOBS, SETUP_NAMES


def scheduling_out(ctx: ServerContext) -> SchedulingOut:
    preset = ctx.loop.preset
    placement = ctx.loop.placement
    return SchedulingOut(
        policy=preset.name,
        placement=placement,
        placement_summary=PLACEMENTS[placement].summary if placement in PLACEMENTS else "",
        whole_gpus=preset.whole_gpus,
        discipline=preset.discipline.value,
        borrowing=preset.borrowing,
        las_thresholds_gpu_s=list(preset.las_thresholds_gpu_s),
        las_within_class=preset.las_within_class,
        gang_one_node=preset.gang_one_node,
        head_reservation=preset.head_reservation,
        elastic=preset.elastic,
        colocation_rule=preset.colocation_rule,
        presets=list(PRESET_NAMES),
        placements=list(PLACEMENTS),
        job_types=list(ctx.loop.job_types),
        knobs=list(ctx.loop.config.knobs),
        knob_names={name: knob.summary for name, knob in KNOBS.items()},
        serving=serving_out(ctx),
    )


def serving_out(ctx: ServerContext) -> ServingSetupOut:
    setup = ctx.serving_setup
    return ServingSetupOut(
        name=setup.name,
        router=setup.router,
        autoscaler=setup.autoscaler or "none",
        admission=setup.admission,
        engine_priority=setup.engine_priority,
        late_binding=setup.late_binding,
        tick_s=setup.tick_s,
        max_hold_s=setup.max_hold_s,
        knobs=list(ctx.serving_knobs),
        knob_names={name: summary for name, (summary, _) in SETUP_KNOBS.items()},
        setups=list(SETUP_NAMES),
    )


def router(ctx: ServerContext) -> APIRouter:
    api = APIRouter(tags=["operations"])

    @api.get("/config", response_model=SchedulingOut)
    def config(caller: Caller) -> SchedulingOut:
        """The scheduler this server runs (any token)."""
        return scheduling_out(ctx)

    return api
