"""The exchange model: ring dependencies, coordination chain, timeouts, local steps."""

import numpy as np
import pytest

from globaldl.fleet.profiles import LinkProfile
from globaldl.simulate.exchange import (
    ExchangeMode,
    ExchangeParameters,
    Workload,
    coordination_chain_seconds,
    estimate_step,
    ring_completion_seconds,
)
from globaldl.simulate.platform import uniform_fleet


def test_ring_of_equal_hops_takes_hops_times_one_hop():
    assert ring_completion_seconds(np.full(4, 0.1), 6) == pytest.approx(0.6)


def test_one_slow_link_sets_the_pace_of_the_whole_ring():
    hops = np.array([0.1, 0.1, 0.5, 0.1])
    assert ring_completion_seconds(hops, 6) == pytest.approx(6 * 0.5)


def test_coordination_word_crosses_every_link_twice_in_sequence():
    assert coordination_chain_seconds(np.full(10, 0.07)) == pytest.approx(2 * 9 * 0.07)


def _estimate(mode, ranks=4, hop=0.1, coordination_hop=0.001, compute=0.05, timeout=30.0):
    fleet = uniform_fleet(LinkProfile("test", 5000, 17500), ranks)
    network = {"ring": np.full(ranks, hop), "coordination": np.full(ranks, coordination_hop)}
    workload = Workload(240_000, 0.005, np.full(ranks, compute))
    return estimate_step(
        fleet, mode, workload, ExchangeParameters(gloo_timeout_seconds=timeout), network
    )


def test_allreduce_step_is_compute_cycle_coordination_and_ring():
    estimate = _estimate(ExchangeMode("dense"))
    coordination = 2 * 3 / 4 * 4 * 0.001  # 6 ms: longer than the 5 ms cycle, so it sets the loop
    assert estimate.step_seconds == pytest.approx(0.05 + coordination / 2 + coordination + 6 * 0.1)
    assert estimate.device_tx_bytes_per_step > 2 * 3 / 4 * 240_000
    assert not estimate.timed_out


def test_allgather_needs_n_minus_one_hops_of_the_whole_payload():
    estimate = _estimate(ExchangeMode("gather", combine="gather"))
    assert estimate.collective_seconds == pytest.approx(3 * 0.1)


def test_local_steps_with_overlap_hide_the_exchange_behind_compute():
    plain = _estimate(ExchangeMode("local", local_steps=8))
    overlapped = _estimate(ExchangeMode("local", local_steps=8, overlap=True))
    exchange = 0.003 + 0.006 + 0.6  # half a 6 ms loop, the coordination, the ring
    assert plain.step_seconds == pytest.approx(0.05 + exchange / 8)
    # 8 x 0.05 s of compute hides 0.4 s of the exchange.
    assert overlapped.step_seconds == pytest.approx(exchange / 8)


def test_a_coordination_chain_longer_than_gloos_timeout_is_reported():
    estimate = _estimate(ExchangeMode("dense"), ranks=400, coordination_hop=0.07)
    assert estimate.timed_out
    assert "coordination" in estimate.timeout_reason
    assert not _estimate(ExchangeMode("dense"), ranks=100, coordination_hop=0.07).timed_out


def test_bad_modes_are_refused_with_the_value():
    with pytest.raises(ValueError, match="combine"):
        ExchangeMode("x", combine="scatter")
    with pytest.raises(ValueError, match="summable"):
        ExchangeMode("x", combine="gather", hierarchy="sites")
