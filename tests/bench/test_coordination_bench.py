"""The idle-coordination bench's table: medians with min-max, and the rule's check (no root)."""

from __future__ import annotations

import pytest

from globaldl.bench.coordination import (
    Measurement,
    coordination_rule_check,
    median_calibration,
    summarise,
)
from globaldl.fleet.coordination import Calibration, IdleCoordination


def _measurement(repeat: int, tx_per_second: float, load: float = 1.0) -> Measurement:
    idle = IdleCoordination(
        ranks=2,
        cycle_time_ms=20.0,
        tx_bytes_per_second=(tx_per_second, 2 * tx_per_second),
        payload_bytes_per_second=(tx_per_second / 2, tx_per_second),
        tx_packets_per_second=(10.0, 20.0),
        init_payload_bytes=(1_000, 1_200),
        cycles_per_second=40.0,
    )
    return Measurement(repeat, load, Calibration(7_000.0 + repeat, idle, 0.25))


def test_a_point_reports_the_median_of_its_repeats_with_min_and_max():
    repeats = [_measurement(0, 9_000), _measurement(1, 3_000, load=4.0), _measurement(2, 6_000)]
    row = summarise(repeats)
    # Mean over the two devices: 1.5 x the first device's rate.
    assert row["tx_bytes_per_second_per_device"] == 1.5 * 6_000
    assert row["tx_bytes_per_second_per_device_min"] == 1.5 * 3_000
    assert row["tx_bytes_per_second_per_device_max"] == 1.5 * 9_000
    assert row["max_tx_bytes_per_cycle"] == pytest.approx(2 * 6_000 / 40)
    assert row["cycles_on_time_share"] == pytest.approx(0.8)
    assert row["load_average_1min_max"] == 4.0 and row["repeats"] == 3
    assert median_calibration(repeats) == repeats[2].calibration


def test_the_rules_bytes_per_cycle_are_checked_against_the_busiest_rank():
    met = coordination_rule_check([summarise([_measurement(0, 6_000)])])
    assert met["status"] == "met" and "300 B per cycle" in met["measured"]
    not_met = coordination_rule_check([summarise([_measurement(0, 60_000)])])
    assert not_met["status"] == "NOT met"
