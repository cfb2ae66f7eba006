"""SimGrid itself, through the adapter: real engine, real TCP model, the exact flow reduction."""

import gc
import os
from pathlib import Path

import numpy as np
import pytest

from globaldl.simulate.engine import (
    LV08_BANDWIDTH_FACTOR,
    LV08_LATENCY_FACTOR,
    TcpModel,
    run_in_child,
    simulate_phases,
)
from globaldl.simulate.topology import Link, Phase, Platform, representative_flows

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


def test_simulating_one_flow_per_class_of_independent_flows_is_exact():
    # Eight devices on three link classes in two sites: a ring hop (independent flows) and a
    # phase whose flows share site links. The reduced run must give every flow the same time.
    rates = [625_000, 125_000, 625_000, 2_000_000, 625_000, 125_000, 2_000_000, 625_000]
    platform = Platform(
        device_up=tuple(Link(rate, 0.01) for rate in rates),
        device_down=tuple(Link(rate * 3, 0.01) for rate in rates),
        site_of_device=(0, 0, 0, 0, 1, 1, 1, 1),
        site_up=(Link(1e6, 0.005), Link(1e6, 0.005)),
        site_down=(Link(4e6, 0.005), Link(4e6, 0.005)),
    )
    order = list(range(8))
    phases = [
        Phase.of(order, order[1:] + order[:1], [30_000] * 8),
        Phase.of([0, 1, 2, 4], [5, 6, 7, 0], [10_000, 20_000, 20_000, 5_000]),
    ]
    tcp = TcpModel(latency_factor=1.0, bandwidth_factor=0.9)
    reduced = simulate_phases(platform, phases, tcp)
    full = simulate_phases(platform, phases, tcp, reduce=False)
    for mine, theirs in zip(reduced, full, strict=True):
        np.testing.assert_allclose(mine, theirs, rtol=1e-9)
    simulated, _ = representative_flows(platform, phases[0])
    assert len(simulated) < 8  # the ring hop needed fewer SimGrid flows than messages


class _Finalized:
    """Garbage in a reference cycle whose finalizer writes the id of the process that ran it."""

    def __init__(self, record: Path) -> None:
        self.record = record
        self.cycle = self

    def __del__(self) -> None:
        with open(self.record, "a") as out:
            out.write(f"{os.getpid()}\n")


def _collect_and_name_the_process() -> int:
    gc.collect()
    return os.getpid()


def test_the_simulation_child_never_finalizes_what_it_inherited(tmp_path):
    # TensorFlow's traced functions are such garbage: finalized in a forked child, they crashed
    # it (a segmentation fault inside the test suite). The cycle is garbage at the fork; the
    # child collects and must leave it alone, the parent then finalizes it once.
    record = tmp_path / "finalized-by"
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        _Finalized(record)
        child = run_in_child(_collect_and_name_the_process)
        assert not record.exists(), f"process {record.read_text().split()} finalized it early"
        gc.collect()
    finally:
        if was_enabled:
            gc.enable()
    assert child != os.getpid()
    assert record.read_text().split() == [str(os.getpid())]
