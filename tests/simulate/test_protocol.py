"""The reduction checked against the unreduced simulation: every rank an actor, every message real.

Both sides run on SimGrid with the same platform, CPU quotas and random draws; the reduced
model composes the steps from one simulated hop per phase, the unreduced one runs Horovod's
loop and Gloo's chain and ring message by message.
"""

import json
import re
import statistics
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from globaldl.fleet.profiles import custom_profile
from globaldl.simulate.exchange import (
    ExchangeMode,
    ExchangeParameters,
    plan_network,
    simulate_plans,
)
from globaldl.simulate.platform import Device, Fleet, default_profiles
from globaldl.simulate.protocol import simulate_protocol
from globaldl.simulate.steps import Workload, simulate_steps

PARAMETERS = ExchangeParameters(message_cpu_seconds=0.0002, cycle_cpu_seconds=0.00005)
# The fleet's one-float allreduce probe (`scripts/allreduce-probe.sh`): one JSON line per run.
PROBE_RUNS = Path(__file__).parents[2] / "results" / "projection" / "allreduce-probe.jsonl"


def _both(profile, ranks, mode, payload_bytes, compute_seconds, cores, rounds=8):
    fleet = Fleet(tuple(Device(profile, cpu_cores=cores) for _ in range(ranks)))
    workload = Workload(payload_bytes, 0.005, np.full(ranks, compute_seconds))
    [network] = simulate_plans([plan_network(fleet, mode, payload_bytes)], PARAMETERS)
    reduced = simulate_steps(fleet, mode, workload, PARAMETERS, network, max_steps=40)
    unreduced = simulate_protocol(fleet, mode, workload, PARAMETERS, rounds=rounds)
    return reduced, unreduced


@pytest.mark.parametrize(
    ("profile", "ranks", "mode", "payload_bytes", "compute_seconds", "cores", "rounds"),
    [
        # dense allreduce, rates only: slow start and bulk overhead of the first 62 kB flight
        ("lte-rates", 4, ExchangeMode("dense"), 246_828, 0.012, 0.5, 6),
        # compressed allgather on a quarter core: CPU-bound, the CFS quota decides (its rounds
        # beat against the 100 ms periods, so the mean needs more of them)
        ("lte-rates", 4, ExchangeMode("gather", combine="gather"), 2_502, 0.025, 0.25, 30),
        # latency and jitter, local steps with overlap
        ("lte-m", 6, ExchangeMode("local", local_steps=4, overlap=True), 123_414, 0.012, 0.5, 8),
    ],
)
def test_reduced_steps_match_the_message_by_message_simulation(
    profile, ranks, mode, payload_bytes, compute_seconds, cores, rounds
):
    profiles = default_profiles()
    link = profiles["lte"].rates_only() if profile == "lte-rates" else profiles[profile]
    reduced, unreduced = _both(link, ranks, mode, payload_bytes, compute_seconds, cores, rounds)
    assert reduced.step_seconds == pytest.approx(unreduced.step_seconds, rel=0.04)
    assert reduced.longest_wait_seconds == pytest.approx(unreduced.longest_wait_seconds, rel=0.15)


def test_the_longest_wait_for_one_message_is_about_n_hops_not_the_chains_two_n():
    # The headline timeout claim, message by message: on a latency-bound link a rank waits
    # about N one-way hops for one message (the coordination word coming round, or the first
    # ring hop from the rank that learnt the result last), not the chain's 2(N-1) hops. Gloo's
    # rendezvous adds two: a cycle's first word waits for rank N-2, which left the last cycle
    # a hop after rank N-1, to post its receive, and for that notification to come back.
    ranks = 10
    link = replace(default_profiles()["lte"], up_jitter_ms=0.0, down_jitter_ms=0.0)
    hop = (link.up_delay_ms + link.down_delay_ms) / 1000
    reduced, unreduced = _both(link, ranks, ExchangeMode("fp16"), 4_000, 0.005, 1.0, 3)
    assert (ranks - 1) * hop < unreduced.longest_wait_seconds < (ranks + 3) * hop
    assert reduced.longest_wait_seconds == pytest.approx(unreduced.longest_wait_seconds, rel=0.05)


@pytest.mark.parametrize(
    ("mode", "named"),
    [
        (ExchangeMode("powersgd", rounds=2), "rounds=2"),
        (ExchangeMode("sites", hierarchy="sites"), "hierarchy='none'"),
    ],
)
def test_exchanges_the_unreduced_simulation_does_not_cover_are_refused_by_name(mode, named):
    fleet = Fleet(tuple(Device(default_profiles()["lte"], cpu_cores=0.5) for _ in range(4)))
    workload = Workload(123_414, 0.005, np.full(4, 0.012))
    with pytest.raises(ValueError, match=re.escape(named)):
        simulate_protocol(fleet, mode, workload, PARAMETERS)


def _probe_medians() -> dict[int, float]:
    """Per fleet size, the median over runs of rank 0's median probe."""
    runs = [json.loads(line) for line in PROBE_RUNS.read_text().splitlines() if line.strip()]
    sizes = sorted({run["devices"] for run in runs})
    medians = {}
    for size in sizes:
        mine = [run for run in runs if run["devices"] == size]
        assert len(mine) >= 3, f"{size} devices: {len(mine)} runs, a median needs 3"
        assert {run["profile"] for run in mine} == {"custom:5:20:50"}
        assert {run["cpu_cores"] for run in mine} == {0.125}
        medians[size] = statistics.median(run["median_seconds"] for run in mine)
    return medians


def test_a_cached_one_float_allreduce_takes_as_long_as_on_the_fleet():
    # Each probe is a coordination cycle that misses the tensor (it comes back from Python
    # after the loop began its next cycle), one that finds it, and the one-float ring: three
    # chains of single messages, pipelined behind each other. Sending the ring's 2N-1 empty
    # segments, as the simulator did before, took 1.80, 4.00 and 8.80 s on 4, 8 and 16.
    measured = _probe_medians()
    assert set(measured) >= {4, 8, 16}
    link = custom_profile(5, 20, 50)
    parameters = ExchangeParameters()
    for ranks, seconds in measured.items():
        fleet = Fleet(tuple(Device(link, cpu_cores=0.125) for _ in range(ranks)))
        workload = Workload(4, 0.005, np.zeros(ranks))
        mode = ExchangeMode("dense")
        [network] = simulate_plans([plan_network(fleet, mode, 4)], parameters)
        reduced = simulate_steps(fleet, mode, workload, parameters, network, max_steps=8)
        assert reduced.step_seconds == pytest.approx(seconds, rel=0.03), ranks
        assert reduced.cycles_per_step == 2
        unreduced = simulate_protocol(fleet, mode, workload, parameters, rounds=4)
        assert unreduced.step_seconds == pytest.approx(seconds, rel=0.03), ranks
