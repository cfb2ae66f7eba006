"""Calibration: the committed table reproduces, CPU time is recovered from walls, rankings."""

import json

import numpy as np
import pytest

from globaldl.fleet.profiles import LinkProfile
from globaldl.simulate.calibration import (
    SimParameters,
    as_measured,
    calibrate,
    evaluate,
    observation_fleet,
    observation_mode,
    ranking_checks,
    score,
)
from globaldl.simulate.fleetdata import load_observations, observation_from_run
from globaldl.simulate.outputs import DEFAULT_OUT_DIR, PARAMETERS_FILE
from globaldl.simulate.run_records import burst_cpu_seconds, steady_round_indices
from globaldl.simulate.steps import StepEstimate

# The small subset CI re-simulates: LeNet in the devices experiment, 2 and 4 devices.
CI_LABELS = {
    "lenet-n2-none",
    "lenet-n4-none",
    "lenet-n2-prune_quantize",
    "lenet-n4-prune_quantize",
}


@pytest.fixture(scope="module")
def committed():
    return json.loads((DEFAULT_OUT_DIR / PARAMETERS_FILE).read_text())


def test_parameters_round_trip_through_their_config(committed):
    parameters = SimParameters.from_config(committed["parameters"])
    assert SimParameters.from_config(parameters.get_config()) == parameters
    with pytest.raises(ValueError, match="unknown"):
        SimParameters.from_config({**committed["parameters"], "warp": 1})


def test_committed_error_table_reproduces_on_a_small_subset(committed):
    parameters = SimParameters.from_config(committed["parameters"])
    observations = [
        item for item in load_observations(experiments=["devices"]) if item.label in CI_LABELS
    ]
    # Every repeat of the benchmark protocol is an observation of its own.
    assert {item.label for item in observations} == CI_LABELS
    assert len({item.key for item in observations}) == len(observations) >= 3 * len(CI_LABELS)
    calibration = evaluate(observations, parameters, parameters.fitted_on)
    committed_rows = {
        (row["label"], row["repeat"]): row
        for row in committed["rows"]
        if row["experiment"] == "devices"
    }
    for row in calibration.rows:
        committed_row = committed_rows[row["label"], row["repeat"]]
        for column in ("simulated_step_seconds", "simulated_compute_seconds"):
            assert row[column] == pytest.approx(committed_row[column], rel=1e-6)
        # The fleet's compute phase is part of its step; the table shows both sides of it.
        assert 0 < row["measured_compute_seconds"] < row["measured_step_seconds"]
    errors = np.array([row["abs_error"] for row in calibration.rows])
    # Not the 10% target (calibration.md reports that); a bound that catches a broken model.
    assert np.median(errors) < 0.3
    assert committed["error_target_met"] == (committed["held_out_median_abs_error"] <= 0.10)


def test_a_burst_within_the_quota_is_all_cpu_and_beyond_it_ran_at_the_quota():
    assert burst_cpu_seconds(0.020, 0.25) == pytest.approx(0.020)
    # 40 ms of wall at a quarter core: 25 ms at full speed, then 15 ms at a quarter.
    assert burst_cpu_seconds(0.040, 0.25) == pytest.approx(0.025 + 0.25 * 0.015)
    assert burst_cpu_seconds(0.5, 1.0) == pytest.approx(0.5)


def _run(rank_totals=None):
    phases = {"data_load": 1.0, "compute": 9.0, "compress": 0.0, "exchange": 90.0}
    phases |= {"decompress": 0.0, "apply": 0.0}
    summary = {
        "steps": 1000,
        "ranks": 2,
        "phase_seconds": phases,
        "gradient_bytes_wire": 1000,
        "rank_batch_sizes": [16, 8],
        "model": "lenet",
        "compression": {"prune": "none", "quantize": "none"},
    }
    if rank_totals is not None:
        summary["rank_totals"] = rank_totals
    link = LinkProfile("test", 5000, 20000).__dict__
    spec = {"label": "x", "fleet": {"cpu_cores_each": [0.5, 0.5]}}
    return {"status": "ok", "summary": summary, "link": link, "spec": spec}


def test_per_rank_totals_give_each_rank_its_own_compute_bounded_by_its_cpu_time():
    totals = [
        {"phase_seconds": {"compute": 10.0, "exchange": 90.0}, "cpu_seconds": 30.0},
        {"phase_seconds": {"compute": 20.0, "exchange": 80.0}, "cpu_seconds": 15.0},
    ]
    observation = observation_from_run("test", _run(totals))
    assert observation.per_rank_phases
    # Rank 1's 20 ms of phases per step are more than its process used: 15 ms bounds them.
    assert observation.compute_cpu_seconds == pytest.approx((0.010, 0.015))
    assert observation.measured_cpu_seconds_per_step == pytest.approx((0.030, 0.015))
    older = observation_from_run("test", _run())
    assert not older.per_rank_phases
    assert older.compute_cpu_seconds == pytest.approx((0.010, 0.010))


def test_measured_step_cpu_is_the_devices_work_where_the_summary_records_it():
    totals = [
        # 999 steps measured (the traced first left out): 8 ms of CPU per step.
        {"phase_seconds": {"compute": 10.0, "exchange": 90.0}, "cpu_seconds": 30.0}
        | {"step_cpu_seconds": 7.992, "step_cpu_steps": 999},
        # No step measured (an older worker): the burst rule and the CPU bound, as before.
        {"phase_seconds": {"compute": 20.0, "exchange": 80.0}, "cpu_seconds": 15.0}
        | {"step_cpu_seconds": 0.0, "step_cpu_steps": 0},
    ]
    observation = observation_from_run("test", _run(totals))
    assert observation.compute_cpu_seconds == pytest.approx((0.008, 0.015))


def test_a_recorded_first_step_is_left_out_of_the_step_the_simulator_must_hit():
    # Rank 0's first step waited 9.1 s (the others traced, the first negotiation); the other
    # 999 steps took 90.9 s of the 100 s: 91 ms each, not the mean's 100 ms.
    first = {"data_load": 0.05, "compute": 0.05, "exchange": 9.0}
    totals = [
        {"phase_seconds": {"data_load": 1.0, "compute": 9.0, "exchange": 90.0}}
        | {"cpu_seconds": 30.0, "first_step_phase_seconds": first},
        {"phase_seconds": {"compute": 20.0, "exchange": 80.0}, "cpu_seconds": 15.0}
        | {"first_step_phase_seconds": {"compute": 1.0, "exchange": 0.0}},
    ]
    observation = observation_from_run("test", _run(totals))
    assert observation.step_seconds == pytest.approx(90.9 / 999)
    assert observation.compute_wall_seconds == pytest.approx(9.9 / 999)
    # Each rank's compute from its own steady steps: rank 1's 19 s over 999 steps.
    assert observation.compute_cpu_seconds[1] == pytest.approx(min(19.0 / 999, 0.015))
    # Without the record (an older summary), the mean over every step, as before.
    assert observation_from_run("test", _run()).step_seconds == pytest.approx(0.1)


def test_a_wait_for_the_last_rank_out_of_an_epochs_end_is_left_out_of_the_step():
    # Rank 1 came out of the epoch's end 40 s after rank 0, which waited for it inside its
    # exchange phase: rank 0's phases hold 140 s, rank 1's the 100 s the steps took.
    totals = [
        {"phase_seconds": {"compute": 10.0, "exchange": 130.0}, "cpu_seconds": 30.0},
        {"phase_seconds": {"compute": 10.0, "exchange": 90.0}, "cpu_seconds": 30.0},
    ]
    assert observation_from_run("test", _run(totals)).step_seconds == pytest.approx(0.100)
    # Either rank may be the last: the step is the rank's that waited least.
    assert observation_from_run("test", _run(totals[::-1])).step_seconds == pytest.approx(0.100)
    # Rank 0's phases where no rank's own are recorded (older summaries).
    assert observation_from_run("test", _run()).step_seconds == pytest.approx(0.100)


def test_a_run_in_rounds_is_measured_as_its_local_steps_and_one_steady_round_per_h_steps():
    # 1000 steps in rounds of 16: 63 round ends (the last one after 8 steps), 90 s of the
    # loop's 100 s, the first of them 6 s (Horovod's first negotiation of the delta's tensors).
    run = _run()
    run["summary"]["rounds"] = {"sync_every": "16", "overlap": False, "rounds": 63}
    run["summary"]["rounds"] |= {"sync_seconds": 90.0, "first_round_sync_seconds": 6.0}
    steady_round = 84.0 / 62
    assert observation_from_run("test", run).step_seconds == pytest.approx(
        10.0 / 1000 + steady_round / 16
    )
    # Without the first round end's record (older summaries): every round end's mean, still
    # one per 16 steps, not the 63/1000 the short last round makes of the run's mean step.
    del run["summary"]["rounds"]["first_round_sync_seconds"]
    assert observation_from_run("test", run).step_seconds == pytest.approx(
        10.0 / 1000 + 90.0 / 63 / 16
    )
    assert observation_from_run("test", _run()).step_seconds == pytest.approx(0.1)


def test_the_loop_wall_is_the_step_to_hit_where_the_summary_records_it():
    # Per step: the loop's wall from step to step, beyond the 100 ms the phases timed.
    run = _run()
    run["summary"] |= {"step_wall_seconds": 110.0, "step_wall_steps": 1000}
    observation = observation_from_run("test", run)
    assert observation.step_seconds == pytest.approx(0.110)
    assert observation.step_measured_by == "loop wall"
    assert observation_from_run("test", _run()).step_measured_by == "phases"
    # In rounds of 4 over 2 epochs of 10 steps: rounds 0-4 cover steps 0-3, 4-7, 8-11 (the
    # first epoch's end inside), 12-15, 16-19 (the second epoch's end with its last step).
    # Round 0 (first negotiation) and rounds 2 and 4 (the epochs' ends: validation, the next
    # epoch's input) are left out; rounds 1 and 3 average 2.0 s.
    run = _run()
    run["summary"] |= {"steps": 20, "epochs": 2}
    run["summary"]["rounds"] = {"sync_every": "4", "overlap": False, "rounds": 5}
    run["summary"]["rounds"] |= {"sync_seconds": 22.0, "first_round_sync_seconds": 3.0}
    run["summary"]["rounds"] |= {
        "round_local_seconds": [5.0, 0.5, 9.0, 0.4, 0.6],
        "round_sync_seconds": [3.0, 1.5, 1.5, 1.6, 14.4],
    }
    observation = observation_from_run("test", run)
    assert observation.step_seconds == pytest.approx(2.0 / 4)
    assert observation.step_measured_by == "loop wall"
    # Its epochs are 10 steps: where an overlapped round in flight would be drained.
    assert observation.epoch_steps == 10
    resumed = observation_from_run(
        "test", run | {"summary": run["summary"] | {"resumed_from_epoch": 1}}
    )
    assert resumed.epoch_steps is None and resumed.step_measured_by == "phases"
    # 22 steps in 2 epochs of 11: round 4 (steps 16-19) is steady now, a sixth, partial round
    # (the run's last 2 steps) is not.
    run["summary"]["steps"] = 22
    run["summary"]["rounds"]["round_sync_seconds"][4] = 1.4
    run["summary"]["rounds"]["round_local_seconds"].append(0.1)
    run["summary"]["rounds"]["round_sync_seconds"].append(20.0)
    assert observation_from_run("test", run).step_seconds == pytest.approx(2.0 / 4)
    # Rounds by wall-clock time do not say where an epoch ended: the phases, as before.
    run["summary"]["rounds"]["sync_every"] = "2s"
    assert observation_from_run("test", run).step_measured_by == "phases"


def test_a_steady_round_is_one_no_epoch_end_touches():
    # Rounds of 4, epochs of 12 steps (ends after steps 12, 24, 36), 40 steps.
    assert steady_round_indices(10, 4, 12, 40) == [1, 4, 7]
    # Round 2 (steps 8-11) ends with the epoch, round 3 (12-15) starts right after it: the
    # epoch's end is in the one's exchange wait or the other's local steps.
    assert 2 not in steady_round_indices(10, 4, 12, 40)
    assert 3 not in steady_round_indices(10, 4, 12, 40)
    # Epochs of 62 in rounds of 16 end inside rounds 3, 7, ...; the run's end (496 steps)
    # with round 30's last step.
    kept = steady_round_indices(31, 16, 62, 496)
    assert {3, 7, 11, 15, 19, 23, 27, 30}.isdisjoint(kept) and len(kept) == 22
    # Fewer recorded rounds than the steps make, or a last round cut short: only whole ones.
    assert steady_round_indices(3, 4, 12, 40) == [1]
    assert steady_round_indices(10, 4, 100, 38) == [1, 2, 3, 4, 5, 6, 7, 8]


def test_an_overlapped_round_is_steady_only_after_a_steady_round():
    # With overlap a round's wall holds the wait for the round before's exchange: round 1 waits
    # for the first exchange (Horovod's first negotiation), and the round after one an epoch
    # ends inside waits for an exchange handed over after validation.
    plain = steady_round_indices(31, 16, 62, 496)
    overlapped = steady_round_indices(31, 16, 62, 496, overlap=True)
    assert {1, 4, 8, 12, 16, 20, 24, 28} <= set(plain)
    assert {1, 4, 8, 12, 16, 20, 24, 28}.isdisjoint(overlapped)
    assert set(overlapped) == set(plain) - {1, 4, 8, 12, 16, 20, 24, 28}
    # Rounds of 4 in epochs of 12: every round no epoch end touches (1, 4, 7) comes right after
    # one that an epoch end touches, so none is steady.
    assert steady_round_indices(10, 4, 12, 40, overlap=True) == []


def test_a_drained_runs_simulated_step_is_read_from_the_rounds_its_measured_step_was():
    run = _run()
    run["summary"] |= {"steps": 40, "epochs": 2, "step_wall_seconds": 0.0}
    run["summary"]["rounds"] = {"sync_every": "4", "overlap": True, "rounds": 10}
    run["summary"]["rounds"] |= {"sync_seconds": 9.0, "first_round_sync_seconds": 0.0}
    run["summary"]["rounds"] |= {
        "round_local_seconds": [0.5] * 10,
        "round_sync_seconds": [1.5] * 10,
    }
    observation = observation_from_run("test", run)
    assert observation.step_measured_by == "loop wall" and observation.epoch_steps == 20
    # Epochs of 20 steps in rounds of 4: rounds 1-3 and 6-8 no epoch end touches; overlapped,
    # rounds 1 and 6 wait for the exchange of a round that is not steady. The steady ones are
    # rounds 2, 3, 7 and 8, as measured.
    walls = (9.0, 6.0, 2.0, 4.0, 5.0, 5.0, 7.0, 3.0, 3.0, 5.0)
    estimate = _estimate_of(step_seconds=1.0, round_seconds=walls)
    assert as_measured(observation, estimate).step_seconds == pytest.approx(3.0 / 4)
    # A step read from the phases keeps the simulator's own mean; so does a run with no
    # steady round to read.
    older = run["summary"] | {"rounds": run["summary"]["rounds"] | {"round_local_seconds": []}}
    by_phases = observation_from_run("test", run | {"summary": older})
    assert by_phases.step_measured_by == "phases" and by_phases.epoch_steps == 20
    assert as_measured(by_phases, estimate).step_seconds == 1.0
    short = _estimate_of(step_seconds=1.0, round_seconds=(9.0,))
    assert as_measured(observation, short).step_seconds == 1.0


def _estimate_of(step_seconds, round_seconds):
    return StepEstimate(
        step_seconds=step_seconds,
        compute_seconds=0.0,
        coordination_seconds=0.0,
        collective_seconds=0.0,
        cycles_per_step=0.0,
        cpu_seconds_per_step=0.0,
        device_tx_bytes_per_step=0.0,
        max_device_tx_bytes_per_step=0.0,
        longest_wait_seconds=0.0,
        longest_wait_in="",
        timed_out=False,
        simulated_steps=len(round_seconds),
        round_seconds=round_seconds,
    )


def test_one_host_keeps_one_machine_name_whether_or_not_its_runs_recorded_the_cpu_signature():
    host = {"cpu": "AMD EPYC", "kernel": "6.18.44-fc-v509", "cores": 2}
    older = observation_from_run("test", _run() | {"machine": host})
    later = observation_from_run(
        "test", _run() | {"machine": host | {"cpu_signature": "family 26 model 2 stepping 1"}}
    )
    assert older.machine == later.machine == "AMD EPYC 6.18.44-fc-v509"
    other = observation_from_run("test", _run() | {"machine": host | {"kernel": "6.18.44-fc-v782"}})
    assert other.machine != older.machine


def test_the_devices_share_the_machine_less_what_its_links_and_launcher_used():
    run = _run() | {"machine": {"cores": 2}}
    run["load"] = {"seconds": 100.0, "emulation_cpu_seconds": 20.0, "driver_cpu_seconds": 5.0}
    run["load"] |= {"outside_cpu_seconds": 5.0}
    observation = observation_from_run("test", run)
    assert observation.host_cores == pytest.approx(1.7)
    fleet = observation_fleet(observation)
    # Two devices computing together on 1.7 cores: 0.85 core each while they run.
    np.testing.assert_allclose(fleet.device_rates(), [0.85, 0.85])
    eight = observation_fleet(
        observation_from_run("test", _sixteen_on_sites() | {"machine": {"cores": 2}})
    )
    np.testing.assert_allclose(eight.device_rates(), [2 / 16] * 16)
    # No machine recorded (the oldest runs): every device has a core of its own.
    assert observation_fleet(observation_from_run("test", _run())).host_cores is None


def _sixteen_on_sites(sites="4x4"):
    run = _run()
    run["summary"] |= {"ranks": 16, "rank_batch_sizes": [16] * 16}
    # Ranks in another order than the devices: rank 1 runs on device 5 (site 2).
    order = [1, 5, *range(2, 5), *range(6, 17)]
    run["summary"]["devices"] = [f"gdlx-{number}" for number in order]
    run["spec"] = {"label": "x", "fleet": {"cpu_cores_per_device": 0.125, "sites": sites}}
    run["spec"]["fleet"]["lan"] = "lan"
    return run


def test_a_run_on_sites_is_simulated_on_its_sites_behind_one_shared_wan_link_each():
    observation = observation_from_run("test", _sixteen_on_sites())
    assert observation.rank_sites[:3] == (0, 1, 0)
    assert observation.rank_sites.count(3) == 4
    fleet = observation_fleet(observation)
    assert len(fleet.sites) == 4 and [len(group) for group in fleet.members()] == [4] * 4
    # Each device's own link is the LAN's; the WAN (the run's link) is the site's.
    assert fleet.devices[0].profile.name == "lan"
    assert fleet.sites[0].wan_up.kbit_per_second == 5000
    with pytest.raises(ValueError, match="grid"):
        observation_from_run("test", _sixteen_on_sites("sites.yaml"))


def test_a_run_is_simulated_with_the_exchange_its_codec_declared_not_one_guessed_from_its_name():
    run = _run()
    summary = run["summary"]
    summary["compression"] = {"prune": "shared-topk", "density": 0.01, "quantize": "intsum"}
    # Summaries from before the declaration: only unpruned float payloads were summed.
    assert observation_from_run("test", run).combine == "gather"
    summary["exchange"] = {"combine": "sum", "collectives_per_step": 1, "hierarchy": "none"}
    observation = observation_from_run("test", run)
    assert (observation.codec, observation.combine, observation.rounds) == (
        "shared-topk0.01+intsum",
        "sum",
        1,
    )
    # PowerSGD sums its P factors, then its Q factors: two rounds, each its own allreduce.
    summary["compression"] = {"prune": "powersgd", "powersgd_rank": 2, "quantize": "fp16"}
    summary["exchange"]["collectives_per_step"] = 2
    observation = observation_from_run("test", run)
    assert (observation.codec, observation.rounds) == ("powersgd-r2+fp16", 2)
    assert observation_mode(observation).rounds == 2
    # The newest summaries carry the declaration itself: one entry per round.
    summary["exchange"]["wire"] = {"combine": "sum", "dtype": "float16", "round_bytes": [9, 7, 5]}
    assert observation_from_run("test", run).rounds == 3
    # A varying length's small allgather before the payload's is not a round of its own.
    summary["exchange"] = {"combine": "gather", "collectives_per_step": 2, "hierarchy": "none"}
    gathered = observation_from_run("test", run)
    assert (gathered.combine, gathered.rounds) == ("gather", 1)


def test_a_site_leaders_three_collectives_per_round_are_one_round_of_the_hierarchy():
    run = _sixteen_on_sites()
    run["summary"]["exchange"] = {"combine": "sum", "collectives_per_step": 3, "hierarchy": "sites"}
    observation = observation_from_run("test", run)
    assert (observation.hierarchy, observation.rounds) == ("sites", 1)
    run["summary"]["exchange"]["collectives_per_step"] = 6  # two rounds, each in three
    assert observation_from_run("test", run).rounds == 2


def test_the_fit_weighs_each_calibration_experiment_the_same_whatever_its_run_count():
    # Nine runs 10% off in one experiment, one run 30% off in the other: pooled, the median
    # would be 10% and the second experiment all but ignored.
    errors = np.array([0.1] * 9 + [-0.3])
    experiments = ["latency"] * 9 + ["ablation"]
    assert score(errors, experiments) == pytest.approx(((0.1 + 0.01) + (0.3 + 0.03)) / 2)
    assert score(errors, ["latency"] * 10) == pytest.approx(0.1 + 0.1 * 0.12)


def test_rankings_count_pairs_the_simulator_orders_unlike_the_fleet():
    rows = [
        {"experiment": "e", "label": label, "measured_step_seconds": measured}
        | {"simulated_step_seconds": simulated}
        for label, measured, simulated in (("a", 1.0, 1.1), ("b", 2.0, 0.9), ("c", 3.0, 3.0))
    ]
    [check] = ranking_checks(rows)
    assert check["pairs"] == 3 and check["discordant_pairs"] == 1
    assert check["discordant"] == ["a vs b (fleet gap 100%)"]
    # Repeats of one configuration are not a pair: their medians are ranked. c's second
    # repeat is ordered unlike its first, but c's medians (2.25 s measured, 1.55 s simulated)
    # still come after b's on both sides.
    repeated = [*rows, rows[2] | {"measured_step_seconds": 1.5, "simulated_step_seconds": 0.1}]
    [check] = ranking_checks(repeated)
    assert check["configurations"] == 3 and check["pairs"] == 3
    assert check["discordant"] == ["a vs b (fleet gap 100%)"]
    # The simulator giving two configurations the fleet ordered one step (to rounding's last
    # digit, either way) orders them no better: it counts against the target, named a tie.
    for other in (1.1 * (1 + 1e-15), 1.1 * (1 - 1e-15)):
        tied = [*rows, rows[0] | {"label": "d", "measured_step_seconds": 1.5}]
        tied[-1]["simulated_step_seconds"] = other
        [check] = ranking_checks(tied)
        assert "a vs d (fleet gap 50%, simulated tie)" in check["discordant"]
        assert check["discordant_simulated_ties"] == 1
    # Measured alike too: neither side orders them, not a discordant pair (d, a's copy, is
    # discordant with b as a is).
    same = [*rows, rows[0] | {"label": "d"}]
    [check] = ranking_checks(same)
    assert check["discordant"] == ["a vs b (fleet gap 100%)", "b vs d (fleet gap 100%)"]
    assert check["discordant_simulated_ties"] == 0


def test_rankings_say_which_discordant_pairs_the_fleets_own_repeats_order_either_way():
    def row(label, measured, simulated):
        return {
            "experiment": "e",
            "label": label,
            "measured_step_seconds": measured,
            "simulated_step_seconds": simulated,
        }

    # a and b: medians 1.00 and 1.05 s measured, simulated the other way round; b's fastest
    # repeat (0.95 s) is faster than a's slowest (1.02 s).
    a = [row("a", 0.98, 2.0), row("a", 1.00, 2.0), row("a", 1.02, 2.0)]
    b = [row("b", 0.95, 1.0), row("b", 1.05, 1.0), row("b", 1.10, 1.0)]
    [check] = ranking_checks(a + b)
    assert check["discordant_pairs"] == 1 and check["discordant_ranges_overlap"] == 1
    assert check["discordant"] == ["a vs b (fleet gap 5%, ranges overlap)"]
    # Apart: b's repeats all slower than a's. Still discordant, no longer overlapping.
    apart = [row("b", measured, 1.0) for measured in (1.03, 1.05, 1.10)]
    [check] = ranking_checks(a + apart)
    assert check["discordant_pairs"] == 1 and check["discordant_ranges_overlap"] == 0
    # One repeat shows no spread: its pairs never count as overlapping.
    [check] = ranking_checks(a + [row("b", 1.01, 1.0)])
    assert check["discordant_pairs"] == 1 and check["discordant_ranges_overlap"] == 0


def test_rankings_also_compare_configurations_on_each_machine_alone():
    def row(label, machine, measured, simulated):
        return {
            "experiment": "e",
            "label": label,
            "machine": machine,
            "measured_step_seconds": measured,
            "simulated_step_seconds": simulated,
        }

    rows = [
        row("a", "m1", 1.0, 1.0),
        row("b", "m2", 0.5, 1.5),
        row("c", "m1", 3.0, 0.5),
        row("c", "m2", 3.0, 3.0),
    ]
    [check] = ranking_checks(rows)
    # Over every run: a and b (never on one machine) are discordant; c's medians (3.0 s
    # measured, 1.75 s simulated) come after both on both sides.
    assert check["discordant"] == ["a vs b (fleet gap 100%)"]
    # On m1 alone c is simulated faster than a; on m2, b and c agree. a and b share no machine.
    assert check["pairs_on_one_machine"] == 2
    assert check["discordant_on_one_machine"] == 1


def test_calibrating_on_unknown_experiments_names_the_available_ones():
    observations = load_observations(experiments=["devices"])
    with pytest.raises(ValueError, match="devices"):
        calibrate(observations, fit_on=("nonexistent",))


def test_the_cli_fits_on_the_declared_calibration_subset_by_default():
    """The CLI keeps the default as text (no simulator import at start-up): it must agree."""
    import inspect

    from globaldl.cli.simulate import calibrate as calibrate_command
    from globaldl.simulate.calibration import CALIBRATION_EXPERIMENTS

    default = inspect.signature(calibrate_command).parameters["fit_on"].default.default
    assert tuple(default.split(",")) == CALIBRATION_EXPERIMENTS


def test_a_run_with_local_steps_is_simulated_with_them_and_one_round_payload():
    run = _run()
    run["summary"]["rounds"] = {"sync_every": "16", "overlap": True, "rounds": 4}
    run["summary"]["exchange"] = {"hierarchy": "none"}
    observation = observation_from_run("test", run)
    assert (observation.local_steps, observation.overlap) == (16, True)
    # 1000 bytes over the run's 4 exchanges.
    assert observation.payload_bytes == pytest.approx(250.0)
    mode = observation_mode(observation)
    assert (mode.local_steps, mode.overlap, mode.hierarchy) == (16, True, "none")
    # A wall-clock budget: the run's mean steps per round (1000 steps in 4 rounds).
    run["summary"]["rounds"] |= {"sync_every": "2s", "overlap": False}
    assert observation_from_run("test", run).local_steps == 250
