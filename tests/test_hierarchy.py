"""Ranks grouped by site: leaders, collectives and modelled traffic of the site hierarchy."""

from __future__ import annotations

import pytest

from globaldl.compression import Combine, WireSpec
from globaldl.exchange import (
    WireSpecError,
    check_wire_spec,
    collectives_per_step,
    device_tx_bytes_per_step_model,
)
from globaldl.hierarchy import Hierarchy


def test_ranks_are_grouped_by_site_and_each_site_is_led_by_its_lowest_rank() -> None:
    hierarchy = Hierarchy.from_site_names(["b", "a", "b", "a", "c"], rank=2)
    assert hierarchy.sites == ((0, 2), (1, 3), (4,))
    assert hierarchy.names == ("b", "a", "c")
    assert hierarchy.own_site == (0, 2) and hierarchy.leader == 0 and not hierarchy.is_leader
    assert hierarchy.leaders == (0, 1, 4)


def test_a_leader_runs_three_collectives_per_round_and_the_wide_area_ring_has_s_members() -> None:
    spec = WireSpec(Combine.SUM, "uint8", (1000,))
    four_by_four = Hierarchy.from_site_names([s for s in "abcd" for _ in range(4)], rank=0)
    assert collectives_per_step(spec, four_by_four) == 3
    assert collectives_per_step(WireSpec(Combine.SUM, "float32", (8, 4)), four_by_four) == 6
    # site ring 2 * 3/4, leaders' ring 2 * 3/4, binomial broadcast to 3 members: 2 sends
    assert device_tx_bytes_per_step_model(spec, 16, 1000, four_by_four) == pytest.approx(5000)
    alone = Hierarchy.from_site_names(["a", "b"], rank=0)  # one device per site: flat
    assert collectives_per_step(spec, alone) == 1
    assert device_tx_bytes_per_step_model(spec, 2, 1000, alone) == pytest.approx(1000)


def test_the_average_device_sends_each_sites_ring_and_tree_and_a_share_of_the_leaders_ring() -> (
    None
):
    four_by_four = Hierarchy.grid(4, 4)
    assert four_by_four.sites == ((0, 1, 2, 3), (4, 5, 6, 7), (8, 9, 10, 11), (12, 13, 14, 15))
    # Per device of 16: site ring 2 * 3/4 each, leaders' ring 4 * 2 * 3/4 over 16, each
    # site's tree 3 copies over its 4 members.
    assert four_by_four.mean_tx_bytes(1000) == pytest.approx(1500 + 6000 / 16 + 750)
    uneven = Hierarchy.from_site_names(["a", "a", "a", "b"], rank=3)
    # Site a: ring 3 * 2 * 2/3 = 4, tree 2; leaders' ring 2 * 2 * 1/2 = 2; site b alone: 0.
    assert uneven.mean_tx_bytes(1000) == pytest.approx((4 + 2 + 2) * 1000 / 4)
    # One device per site is the flat ring: every device sends as the leader does.
    alone = Hierarchy.grid(3, 1)
    assert alone.mean_tx_bytes(1000) == pytest.approx(alone.leader_tx_bytes(1000))


def test_gathered_payloads_are_refused_with_a_site_hierarchy() -> None:
    spec = WireSpec(Combine.GATHER, "uint8", (None,))
    assert check_wire_spec(spec) is spec
    with pytest.raises(WireSpecError, match="hierarchy='sites' sums payloads site by site"):
        check_wire_spec(spec, "sites")
