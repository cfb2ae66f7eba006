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


def test_gathered_payloads_are_refused_with_a_site_hierarchy() -> None:
    spec = WireSpec(Combine.GATHER, "uint8", (None,))
    assert check_wire_spec(spec) is spec
    with pytest.raises(WireSpecError, match="hierarchy='sites' sums payloads site by site"):
        check_wire_spec(spec, "sites")
