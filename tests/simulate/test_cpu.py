"""The CFS quota model: full speed until the period's quota is spent, then wait for the next."""

import numpy as np
import pytest

from globaldl.simulate.cpu import CfsQuota


def test_a_burst_within_the_quota_runs_at_full_core_speed():
    quarter_core = CfsQuota(np.array([0.25]))
    assert quarter_core.run(np.zeros(1), np.array([0.010]))[0] == pytest.approx(0.010)


def test_work_beyond_the_quota_waits_for_the_next_periods():
    # 100 ms of CPU at a quarter core: 25 ms in each of four 100 ms periods.
    quarter_core = CfsQuota(np.array([0.25]))
    assert quarter_core.run(np.zeros(1), np.array([0.1]))[0] == pytest.approx(0.325)


def test_back_to_back_bursts_average_the_quota():
    quarter_core = CfsQuota(np.array([0.25]))
    finished = 0.0
    for _ in range(40):
        finished = quarter_core.run(np.array([finished]), np.array([0.02]))[0]
    assert 40 * 0.02 / finished == pytest.approx(0.25, rel=0.03)


def test_a_whole_core_or_more_is_never_throttled():
    devices = CfsQuota(np.array([1.0, 2.0]))
    np.testing.assert_allclose(devices.run(np.zeros(2), np.array([0.5, 0.5])), [0.5, 0.5])


def test_devices_sharing_a_host_run_at_their_share_and_still_meet_their_quota():
    # Half a core of quota, a quarter core of a shared host: never throttled, 4x slower.
    shared = CfsQuota(np.array([0.5]), rate=0.25)
    assert shared.run(np.zeros(1), np.array([0.010]))[0] == pytest.approx(0.040)
    # A quarter core of quota at half a core: 25 ms of CPU take 50 ms, then the period ends
    # (at 100 ms); the other 15 ms of CPU take 30 ms more.
    throttled = CfsQuota(np.array([0.25]), rate=0.5)
    assert throttled.run(np.zeros(1), np.array([0.040]))[0] == pytest.approx(0.130)
    with pytest.raises(ValueError, match="rate"):
        CfsQuota(np.array([0.25]), rate=1.5)


def test_advance_stops_at_the_limit_and_shares_the_quota_with_other_work():
    quarter_core = CfsQuota(np.array([0.25]))
    stopped, left = quarter_core.advance(np.zeros(1), np.array([0.1]), 0.15)
    assert stopped[0] == pytest.approx(0.15) and left[0] == pytest.approx(0.05)
    # Another thread's 1 ms finds period 1's quota spent and runs at the start of period 2.
    assert quarter_core.run(np.array([0.15]), np.array([0.001]))[0] == pytest.approx(0.201)
    # The rest: 24 ms left in period 2, 25 ms in period 3, the last 1 ms in period 4.
    finished, left = quarter_core.advance(stopped, left, np.inf)
    assert left[0] == 0.0 and finished[0] == pytest.approx(0.401)


def test_the_model_keeps_moving_hours_into_a_simulation():
    # Far from zero a period's end divides into the period it ends; the model must not stall.
    offset = np.array([0.0123])
    quarter_core = CfsQuota(np.array([0.25]), period_offset_seconds=offset)
    start = np.array([7200.0 + 0.0123 + 0.1 * 3])  # a period starts here
    # 60 ms: 25 ms, wait, 25 ms, wait, 10 ms.
    assert quarter_core.run(start, np.array([0.06]))[0] == pytest.approx(start[0] + 0.21, abs=1e-9)


def test_bad_quotas_are_refused_with_the_value():
    with pytest.raises(ValueError, match="cores"):
        CfsQuota(np.array([0.5, 0.0]))
