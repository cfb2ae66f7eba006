"""Time to accuracy, step numbers, target checks and the cycle-time rule, from given numbers."""

from __future__ import annotations

import math

import pytest
from experiment_fakes import summary
from hypothesis import given
from hypothesis import strategies as st

from globaldl.experiments.analysis import (
    NO_RESULT,
    Spread,
    add_traffic_ratios,
    at_least_times_sooner,
    at_most_times,
    epoch_end_seconds,
    falls_with_devices,
    mean_step_seconds,
    time_to_target,
    training_seconds,
    wire_bytes_per_step,
)
from globaldl.fleet.cycle_time import (
    CYCLE_TIME_LADDER_MS,
    MAX_COORDINATION_SHARE,
    auto_cycle_time_ms,
    coordination_bytes_per_second,
)


def _history(seconds: list[float], accuracies: list[float]) -> list[dict]:
    return summary(epoch_seconds=seconds, val_accuracies=accuracies)["history"]


def test_time_to_target_is_the_end_of_the_first_epoch_that_reaches_it() -> None:
    history = _history([10.0, 12.0, 8.0, 9.0], [0.5, 0.85, 0.93, 0.95])
    assert time_to_target(history, 0.90) == pytest.approx(30.0)
    assert time_to_target(history, 0.50) == pytest.approx(10.0)  # reaching exactly counts
    assert time_to_target(history, 0.95) == pytest.approx(39.0)


def test_time_to_target_is_none_when_no_epoch_reaches_it() -> None:
    history = _history([10.0, 12.0], [0.5, 0.85])
    assert time_to_target(history, 0.90) is None
    assert time_to_target([], 0.90) is None


def test_time_to_target_ignores_a_later_dip_below_the_target() -> None:
    history = _history([5.0, 5.0, 5.0], [0.91, 0.80, 0.95])
    assert time_to_target(history, 0.90) == pytest.approx(5.0)


@pytest.mark.parametrize("target", [0.0, -0.1, 1.5])
def test_time_to_target_rejects_a_target_outside_0_1(target: float) -> None:
    with pytest.raises(ValueError, match="target_accuracy"):
        time_to_target(_history([1.0], [0.5]), target)


def test_epoch_end_seconds_rejects_negative_or_missing_seconds() -> None:
    with pytest.raises(ValueError, match=r"history\[1\]"):
        epoch_end_seconds([{"seconds": 1.0}, {"seconds": -2.0}])
    with pytest.raises(ValueError, match=r"history\[0\]"):
        epoch_end_seconds([{"val_accuracy": 0.5}])


def test_step_numbers_come_from_phase_seconds_and_wire_bytes_over_steps() -> None:
    run = summary(
        epoch_seconds=[3.0, 4.0],
        val_accuracies=[0.5, 0.6],
        steps=10,
        phase_seconds={"compute": 1.5, "exchange": 2.5, "apply": 1.0},
        wire_bytes=4000,
    )
    assert mean_step_seconds(run) == pytest.approx(0.5)
    assert wire_bytes_per_step(run) == pytest.approx(400.0)
    assert training_seconds(run) == pytest.approx(7.0)
    assert mean_step_seconds({**run, "steps": 0}) is None


def test_speedup_target_is_met_only_at_the_factor() -> None:
    met = at_least_times_sooner("goal", 10.0, 100.0, 10.0)
    missed = at_least_times_sooner("goal", 10.0, 99.0, 10.0)
    assert (met.met, met.status) == (True, "met")
    assert (missed.met, missed.status) == (False, "NOT met")
    assert missed.measured == "9.90x (10.0 s vs 99.0 s)"


def test_speedup_target_when_one_run_never_reached_the_accuracy() -> None:
    compressed_missing = at_least_times_sooner("goal", None, 100.0, 10.0)
    assert compressed_missing.met is False
    assert at_least_times_sooner("goal", None, None, 10.0).status == "not evaluated"
    # The baseline never got there in 300 s: the speed-up is at least 30x, enough for 10x.
    bounded = at_least_times_sooner("goal", 10.0, None, 10.0, slower_total_seconds=300.0)
    assert bounded.met is True and bounded.measured.startswith("> 30.0x")
    # ... but a bound of 5x says nothing about a 10x goal.
    unknown = at_least_times_sooner("goal", 10.0, None, 10.0, slower_total_seconds=50.0)
    assert unknown.met is None and unknown.status == "not evaluated"


def test_at_most_times_compares_with_a_reference() -> None:
    assert at_most_times("goal", 0.15, 0.10, 1.5).met is True
    assert at_most_times("goal", 0.16, 0.10, 1.5).met is False
    assert at_most_times("goal", None, 0.10, 1.5).met is None


def test_falls_with_devices_is_met_only_when_every_step_falls_and_says_so_in_the_text() -> None:
    falling = falls_with_devices("goal", {1: 100.0, 2: 60.0, 4: 40.0})
    assert falling.met is True
    assert falling.measured == "1: 100 s, 2: 60.0 s, 4: 40.0 s; falls at every step"
    # The committed devices table marked this met while its text said "falls at every step:
    # no": one definition now decides both.
    resnet = falls_with_devices("goal", {1: 44.0, 2: 37.1, 4: 17.3, 8: 19.6})
    assert resnet.met is False and resnet.measured.endswith("does not fall at 4 -> 8")
    wobbly = falls_with_devices("goal", {1: 100.0, 2: 110.0, 4: 40.0})
    assert wobbly.met is False and wobbly.measured.endswith("does not fall at 1 -> 2")
    rising = falls_with_devices("goal", {1: 100.0, 2: 150.0, 4: 160.0})
    assert rising.met is False
    never = falls_with_devices("goal", {1: 100.0, 4: None})
    assert never.met is False and "4: not reached" in never.measured
    # A fleet without a finished run leaves the goal open instead of deciding it.
    failed = falls_with_devices("goal", {1: 100.0, 2: NO_RESULT, 4: 40.0})
    assert failed.met is None and "2: no finished run" in failed.measured
    assert falls_with_devices("goal", {1: 100.0}).met is None
    assert falls_with_devices("goal", {1: None, 2: None, 4: None}).met is None
    assert falls_with_devices("goal", {1: math.inf, 4: 10.0}).met is None
    # Medians that fall while neighbouring ranges overlap: met, and the text says where.
    spread = falls_with_devices(
        "goal",
        {
            1: Spread(23.0, 18.4, 25.8, 3),
            2: Spread(14.8, 14.3, 17.2, 3),
            4: Spread(9.6, 7.8, 13.0, 3),
        }
        | {8: Spread(8.6, 7.6, 9.3, 3)},
    )
    assert spread.met is True
    assert spread.measured.endswith(
        "falls at every step; the ranges overlap at 4 -> 8: those falls are within the spread"
    )


@pytest.mark.parametrize(
    ("up_kbit", "down_kbit", "expected_ms"),
    [
        (20000, 100000, 1.0),  # fibre: Horovod's default
        (5000, 17500, 5.0),  # lte
        (5000, 20000, 5.0),  # the ablation's custom:5:20
        (750, 1600, 50.0),  # slow-4g
        (1000, 1000, 20.0),  # lte-m
        (62, 26, 1000.0),  # nb-iot: capped at the ladder's top
        (1e7, 1e7, 1.0),  # unshaped
    ],
)
def test_auto_cycle_time_per_profile(up_kbit: float, down_kbit: float, expected_ms: float) -> None:
    assert auto_cycle_time_ms(up_kbit, down_kbit) == expected_ms


@given(
    up_kbit=st.floats(min_value=1, max_value=1e7, allow_nan=False),
    down_kbit=st.floats(min_value=1, max_value=1e7, allow_nan=False),
)
def test_auto_cycle_time_keeps_idle_coordination_under_its_share_unless_capped(
    up_kbit: float, down_kbit: float
) -> None:
    cycle_ms = auto_cycle_time_ms(up_kbit, down_kbit)
    assert cycle_ms in CYCLE_TIME_LADDER_MS
    narrowest_bytes_per_second = min(up_kbit, down_kbit) * 1000 / 8
    if cycle_ms < CYCLE_TIME_LADDER_MS[-1]:
        share = coordination_bytes_per_second(cycle_ms) / narrowest_bytes_per_second
        assert share <= MAX_COORDINATION_SHARE + 1e-12
    # A faster link never gets a longer cycle.
    assert auto_cycle_time_ms(up_kbit * 2, down_kbit * 2) <= cycle_ms


@pytest.mark.parametrize("bad", [0, -5, float("nan"), float("inf")])
def test_auto_cycle_time_rejects_a_bad_rate(bad: float) -> None:
    with pytest.raises(ValueError, match="up_kbit_per_second"):
        auto_cycle_time_ms(bad, 1000)


def test_measured_traffic_ratio_compares_each_run_with_the_dense_run_on_the_same_fleet() -> None:
    rows = [
        {
            "model": "lenet",
            "devices": 4,
            "profile": "lte",
            "compression": "none",
            "horovod_cycle_time_ms": 5.0,
            "device_tx_bytes_per_step": 600_000.0,
        },
        {
            "model": "lenet",
            "devices": 4,
            "profile": "lte",
            "compression": "prune+quantize",
            "horovod_cycle_time_ms": 5.0,
            "device_tx_bytes_per_step": 30_000.0,
        },
        # Another fleet size has no dense run: no ratio rather than a wrong one.
        {
            "model": "lenet",
            "devices": 8,
            "profile": "lte",
            "compression": "prune+quantize",
            "horovod_cycle_time_ms": 5.0,
            "device_tx_bytes_per_step": 40_000.0,
        },
        # A run that failed has no bytes.
        {
            "model": "lenet",
            "devices": 4,
            "profile": "lte",
            "compression": "fp16",
            "horovod_cycle_time_ms": 5.0,
        },
    ]
    add_traffic_ratios(rows)
    assert [row["traffic_ratio_vs_dense_measured"] for row in rows] == [1.0, 20.0, None, None]
