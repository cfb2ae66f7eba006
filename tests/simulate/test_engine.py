"""SimGrid itself, through the adapter: real engine, real TCP model, unreduced ring."""

import numpy as np
import pytest

from globaldl.simulate.engine import (
    LV08_BANDWIDTH_FACTOR,
    LV08_LATENCY_FACTOR,
    Link,
    Phase,
    Platform,
    TcpModel,
    simulate_phases,
    simulate_ring,
)
from globaldl.simulate.exchange import ring_completion_seconds

FAST = Link(1e12, 0.0)


def test_one_message_follows_simgrids_lv08_tcp_model():
    # 625 kB over a 5 Mbit/s, 50 ms link: LV08 gives size / (rate x 0.97) + 13.01 x latency.
    platform = Platform((Link(625_000, 0.05), FAST), (FAST, FAST))
    [seconds] = simulate_phases(platform, [Phase.of([0], [1], [625_000])], TcpModel())
    expected = 625_000 / (625_000 * LV08_BANDWIDTH_FACTOR) + LV08_LATENCY_FACTOR * 0.05
    assert seconds[0] == pytest.approx(expected, rel=1e-3)


def test_flows_sharing_a_site_uplink_slow_each_other_down():
    # Two devices of one site send out of it at once: the 1 MB/s WAN uplink is shared.
    platform = Platform(
        device_up=(FAST, FAST, FAST),
        device_down=(FAST, FAST, FAST),
        site_of_device=(0, 0, -1),
        site_up=(Link(1e6, 0.0),),
        site_down=(FAST,),
    )
    tcp = TcpModel(latency_factor=1.0, bandwidth_factor=1.0)
    alone, together = simulate_phases(
        platform, [Phase.of([0], [2], [1_000_000]), Phase.of([0, 1], [2, 2], [1_000_000] * 2)], tcp
    )
    assert alone[0] == pytest.approx(1.0, rel=1e-3)
    assert together == pytest.approx([2.0, 2.0], rel=1e-3)


def test_reduced_ring_matches_the_unreduced_simulation_on_mixed_links_and_sites():
    # The reduction (one simulated hop, hops composed by the ring's dependencies) against a
    # real actor-per-rank ring in SimGrid: 8 ranks, three link classes, two sites.
    rates = [625_000, 125_000, 625_000, 2_000_000, 625_000, 125_000, 2_000_000, 625_000]
    platform = Platform(
        device_up=tuple(Link(rate, 0.01) for rate in rates),
        device_down=tuple(Link(rate * 3, 0.01) for rate in rates),
        site_of_device=(0, 0, 0, 0, 1, 1, 1, 1),
        site_up=(Link(1e6, 0.005), Link(1e6, 0.005)),
        site_down=(Link(4e6, 0.005), Link(4e6, 0.005)),
    )
    tcp = TcpModel(latency_factor=1.0, bandwidth_factor=0.9)
    order = list(range(8))
    chunk, hops = 30_000, 14
    unreduced = simulate_ring(platform, order, hops, chunk, tcp).max()
    [one_hop] = simulate_phases(
        platform, [Phase.of(order, order[1:] + order[:1], [chunk] * 8)], tcp
    )
    reduced = ring_completion_seconds(one_hop, hops)
    assert reduced == pytest.approx(unreduced, rel=0.05)
    assert np.all(one_hop > 0)
