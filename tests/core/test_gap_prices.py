"""Gap prices: what a GPU's free share is worth to the sharing mix, from the fluid bin-packing LP's duals."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tessera.core.fragmentation import TypicalPod
from tessera.core.gap_prices import gap_waste, packing_lp, share_mix, share_prices, typical_gap_waste


def test_a_share_that_tiles_a_gpu_costs_its_size_and_leaves_no_waste() -> None:
    prices = share_prices({250: 1.0})
    assert prices[250] == pytest.approx(0.25)
    waste = gap_waste(prices)
    assert waste[1000] == pytest.approx(0) and waste[500] == pytest.approx(0)
    assert waste[249] == pytest.approx(249)  # nothing of the mix fits


def test_the_remainder_of_a_big_share_is_waste_when_small_fillers_are_scarce() -> None:
    # Nine 810s for every 160: most 810s must run alone, so each costs a whole GPU and the 160 rides for free.
    scarce = share_prices({810: 0.9, 160: 0.1})
    assert scarce == pytest.approx({810: 1.0, 160: 0.0})
    assert gap_waste(scarce)[190] == pytest.approx(190)
    # Nine 160s for every 810: every 810 gets a 160, the rest pack six to a GPU, and the 190 is nearly all used.
    plentiful = share_prices({810: 0.1, 160: 0.9})
    assert plentiful == pytest.approx({810: 5 / 6, 160: 1 / 6})
    assert gap_waste(plentiful)[190] == pytest.approx(190 - 1000 / 6)


def test_prices_add_up_to_the_fewest_gpus_the_mix_needs() -> None:
    # Strong duality: sum of mix x price = the LP's GPUs per unit of pods. 0.1 GPU pairs each 810 with a 160,
    # the other 0.8 of 160s go six to a GPU.
    mix = {810: 0.1, 160: 0.9}
    prices = share_prices(mix)
    assert sum(mix[s] * prices[s] for s in mix) == pytest.approx(0.1 + 0.8 / 6)


def test_with_pod_counts_the_lp_bounds_the_gpus_any_packing_needs() -> None:
    assert packing_lp({500: 3.0})[1] == pytest.approx(1.5)  # relaxed: half a GPU for the third 500
    assert packing_lp({810: 2.0, 160: 1.0})[1] == pytest.approx(2.0)  # the 160 rides with an 810
    assert packing_lp({810: 2.0, 300: 3.0})[1] == pytest.approx(3.0)  # no 300 fits next to an 810
    assert packing_lp({}) == ({}, 0.0)


def test_shares_off_the_ten_milli_grid_are_priced_exactly() -> None:
    waste = gap_waste(share_prices({333: 1.0}))
    assert waste[1000] == pytest.approx(0) and waste[332] == pytest.approx(332)
    # 999 free milli hold three 333s, all a whole GPU could: worth a GPU, so its waste is 999 - 1000.
    assert waste[999] == pytest.approx(-1)


def test_no_sharing_pods_means_no_term() -> None:
    whole = [TypicalPod(8_000, 1, 1000, frozenset(), 0.5), TypicalPod(4_000, 0, 0, frozenset(), 0.5)]
    assert share_mix(whole) == {}
    assert not typical_gap_waste(whole).any()


def test_share_mix_sums_the_popularity_of_pods_with_the_same_share() -> None:
    pods = [
        TypicalPod(4_000, 1, 500, frozenset(), 0.25),
        TypicalPod(8_000, 1, 500, frozenset({"T4"}), 0.25),
        TypicalPod(8_000, 1, 1000, frozenset(), 0.5),
    ]
    assert share_mix(pods) == {500: 0.5}


@settings(max_examples=40, deadline=None)
@given(st.dictionaries(st.integers(1, 99).map(lambda k: 10 * k), st.floats(0.01, 1.0), min_size=1, max_size=6))
def test_no_placement_gains_from_the_waste_table(mix: dict[int, float]) -> None:
    """Putting share s on a GPU with g free changes the waste by 1000 * (price + regret) - s with regret >= 0: the
    table can rank placements but never makes a share cheaper than its price. A whole free GPU is never waste."""
    prices = share_prices(mix)
    waste = gap_waste(prices)
    assert waste[0] == 0 and waste[1000] == pytest.approx(0, abs=1e-6)
    for share, price in prices.items():
        free = np.arange(share, 1001)
        regret = (waste[free - share] - waste[free] - 1000 * price + share) / 1000
        assert regret.min() >= -1e-9
