"""The projection-cost benchmark's verdict on the 10,000-device target."""

from globaldl.bench.simulate import target_verdict


def _row(devices, wall_seconds):
    return {
        "devices": devices,
        "wall_seconds_median": wall_seconds,
        "wall_seconds_min": wall_seconds,
        "wall_seconds_max": wall_seconds,
    }


def test_ten_thousand_devices_under_ten_minutes_is_met_and_over_it_is_not():
    assert target_verdict([_row(100, 1.0), _row(10_000, 599.0)]).endswith(": met")
    assert target_verdict([_row(10_000, 601.0)]).endswith("NOT met")
    assert "not evaluated" in target_verdict([_row(100, 1.0)])
