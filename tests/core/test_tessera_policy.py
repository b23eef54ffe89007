"""Tessera's own placement policy: its two extra fragmentation terms and its online learning."""

import numpy as np
import pytest

from tessera.core.cluster import ClusterState, NodeSpec
from tessera.core.fragmentation import FragmentationModel, TypicalPod, random_fill_waste, typical_pods
from tessera.core.placement import Placer, make_policy
from tessera.core.placement.tessera import TesseraFragmentation, TesseraParams, TesseraPolicy
from tessera.core.workload import Placement, Request

WHOLE = TypicalPod(8_000, 1, 1000, frozenset(), 1.0)


def test_fill_waste_is_the_remainder_when_a_single_share_repeats() -> None:
    waste = random_fill_waste([TypicalPod(1000, 1, 300, frozenset(), 1.0)])
    assert waste[0] == 0 and waste[299] == 299 and waste[300] == 0
    assert waste[1000] == pytest.approx(100)  # three 300s leave 100


def test_fill_waste_averages_over_the_shares_that_fit() -> None:
    pods = [TypicalPod(1000, 1, 600, frozenset(), 0.5), TypicalPod(1000, 1, 500, frozenset(), 0.5)]
    waste = random_fill_waste(pods)
    # 1000 free: a 600 leaves 400 (wasted), a 500 leaves 500 (one more 500 fills it): mean 200.
    assert waste[1000] == pytest.approx(200)


def test_cpu_stranding_counts_gpus_the_free_cpu_cannot_feed() -> None:
    model = FragmentationModel([WHOLE], ["G2"])
    stranded = model.cpu_stranded(np.array([16_000, 64_000]), np.full((2, 8), 1000), np.array([0, 0]))
    assert stranded.tolist() == [6000.0, 0.0]  # 16 cores feed two 8-core pods of eight free GPUs


def test_cpu_only_pods_go_where_cpu_is_plentiful_relative_to_gpus() -> None:
    # First node: 8 GPUs and just enough CPU for them; second: 2 GPUs and plenty of CPU.
    state = ClusterState([NodeSpec("dense", 64_000, 262_144, 8, "G2"), NodeSpec("rich", 104_000, 524_288, 2, "T4")])
    workload = [Request(num_gpus=1, gpu_milli=1000, cpu_milli=8_000)] * 9 + [Request(cpu_milli=16_000)]
    cpu_pod = Request(cpu_milli=16_000)
    chosen = {}
    for name in ("fgd", "tessera"):
        engine = Placer(state, make_policy(name, typical_pods(workload), state.model_names))
        decision = engine.decide(cpu_pod, np.random.default_rng(0))
        assert decision is not None
        chosen[name] = decision.node
    assert chosen == {"fgd": 0, "tessera": 1}  # fgd sees no difference and takes the first node


def test_online_mode_refits_on_a_doubling_schedule_and_the_engine_drops_stale_scores() -> None:
    state = ClusterState([NodeSpec(f"n{i}", 32_000, 65_536, 4, "T4") for i in range(3)])
    policy = make_policy("tessera-online", (), state.model_names)
    assert isinstance(policy, TesseraPolicy)
    engine = Placer(state, policy)
    request = Request(num_gpus=1, gpu_milli=250, cpu_milli=1000)
    versions = []
    for _ in range(130):
        engine.decide(request, np.random.default_rng(0))
        versions.append(policy.model_version)
    assert versions[62] == 0 and versions[63] == 1 and versions[127] == 2
    assert [p.gpu_milli for p in policy.frag.pods] == [250]
    assert [p.mem_mib for p in policy.frag.pods] == [0]


def test_typical_pods_carry_the_mean_memory_of_their_shape() -> None:
    requests = [Request(num_gpus=1, gpu_milli=1000, cpu_milli=8_000, mem_mib=m) for m in (10_000, 20_000)]
    (pod,) = typical_pods(requests)
    assert pod.mem_mib == 15_000 and pod.popularity == 1.0


def test_host_memory_limits_the_pods_a_node_can_still_feed() -> None:
    model = FragmentationModel([TypicalPod(8_000, 1, 1000, frozenset(), 1.0, mem_mib=32_768)], ["G2"])
    free = np.full((1, 8), 1000)
    assert model.cpu_stranded(np.array([64_000]), free, np.array([0])).tolist() == [0.0]
    # 64 cores feed eight pods, but 64 GiB of memory only two: six free GPUs are stranded.
    assert model.cpu_stranded(np.array([64_000]), free, np.array([0]), np.array([65_536])).tolist() == [6000.0]


def test_joint_waste_counts_pods_per_gpu_and_per_cpu() -> None:
    frag = TesseraFragmentation([TypicalPod(1_000, 1, 300, frozenset(), 1.0)], ["G2"], TesseraParams())
    one_gpu = frag.joint_waste(np.array([64_000]), np.array([[1000, 0]]), np.array([0]))
    assert one_gpu.tolist() == [100.0]  # three 300s fit one free GPU
    short_of_cpu = frag.joint_waste(np.array([2_000]), np.array([[1000, 1000]]), np.array([0]))
    assert short_of_cpu.tolist() == [1400.0]  # two cores feed two 300s of the 2000 idle milli


def test_gap_prices_keep_the_free_share_the_mix_can_still_fill_exactly() -> None:
    # Mostly 250s, some 300s. One GPU has 500 free, another 600. A 250 on the 500 leaves 250 (another 250 fills it)
    # and keeps the 600, which two 300s fill exactly; on the 600 it leaves 350, where a 300 still wastes 50.
    pods = [TypicalPod(1000, 1, 250, frozenset(), 0.8), TypicalPod(1000, 1, 300, frozenset(), 0.2)]
    before = np.array([[500], [600]])
    after = np.array([[250], [350]])
    cpu, models = np.array([60_000, 60_000]), np.array([0, 0])
    scores = {}
    for weight in (0.0, TesseraParams().gap_price_weight):
        frag = TesseraFragmentation(pods, ["G2"], TesseraParams(gap_price_weight=weight))
        scores[weight] = frag.node_frag(cpu, before, models) - frag.node_frag(cpu - 1000, after, models)
    assert scores[0.0][0] == pytest.approx(scores[0.0][1])  # the per-GPU fill model sees no difference
    with_prices = scores[TesseraParams().gap_price_weight]
    assert with_prices[0] > with_prices[1] + 100

    state = ClusterState([NodeSpec(f"n{i}", 64_000, 262_144, 1, "G2") for i in range(2)])
    for node, used in enumerate((500, 400)):
        state.bind(Placement(node, (0,), Request(num_gpus=1, gpu_milli=used, cpu_milli=1000), used))
    decision = Placer(state, TesseraPolicy(pods, state.model_names)).decide(
        Request(num_gpus=1, gpu_milli=250, cpu_milli=1000), np.random.default_rng(0)
    )
    assert decision is not None and decision.node == 0
