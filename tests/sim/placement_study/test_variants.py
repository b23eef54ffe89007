"""The workload variants: seeded, and each step changes what it says it changes."""

from tessera.sim.placement_study.inputs import default_inputs
from tessera.sim.placement_study.variants import HELD_OUT, TUNING, Variant, derive, multi_gpu_share


def test_a_variant_is_the_same_pod_list_every_time_and_the_sets_are_disjoint() -> None:
    inputs = default_inputs()
    variant = Variant("mix", constrained_share=0.2, multi_gpu_share=0.3, cpu_only_factor=1.5)
    assert derive(variant, inputs.requests, inputs.nodes) == derive(variant, inputs.requests, inputs.nodes)
    assert not {v.name for v in TUNING} & {v.name for v in HELD_OUT}


def test_each_step_moves_its_own_share() -> None:
    inputs = default_inputs()
    requests = inputs.requests
    cpu_only = sum(r.num_gpus == 0 for r in requests)
    gpu_pods = sum(r.num_gpus > 0 for r in requests)
    doubled = derive(Variant("c", cpu_only_factor=2.0), requests, inputs.nodes)
    assert sum(r.num_gpus == 0 for r in doubled) == 2 * cpu_only
    halved = derive(Variant("h", cpu_only_factor=0.5), requests, inputs.nodes)
    assert sum(r.num_gpus == 0 for r in halved) == round(cpu_only / 2)
    multi = derive(Variant("m", multi_gpu_share=0.4), requests, inputs.nodes)
    assert len(multi) == len(requests) and multi_gpu_share(multi) >= 0.4 > multi_gpu_share(requests)
    spec = derive(Variant("s", constrained_share=0.25), requests, inputs.nodes)
    constrained = [r for r in spec if r.gpu_types]
    assert abs(len(constrained) - 0.25 * gpu_pods) <= 0.01 * gpu_pods
    models = {n.gpu_model for n in inputs.nodes}
    assert all(len(r.gpu_types) == 1 and r.gpu_types <= models for r in constrained)
    # Only the constraint changed: the same shapes otherwise.
    assert [(r.num_gpus, r.gpu_milli, r.cpu_milli) for r in spec] == [
        (r.num_gpus, r.gpu_milli, r.cpu_milli) for r in requests
    ]
