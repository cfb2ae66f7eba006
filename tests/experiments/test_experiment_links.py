"""The latency, scale and sites experiments: plans, tables, projections, targets (no fleet)."""

from __future__ import annotations

from pathlib import Path

import pytest
from experiment_fakes import device_resources, result, summary

from globaldl.experiments import LatencyExperiment, ScaleExperiment, SitesExperiment
from globaldl.experiments.latency import latency_bound_from_ms
from globaldl.experiments.latency import steady_step_seconds as latency_steady_step_seconds


def test_latency_plan_sweeps_the_delay_per_access_link_for_three_codecs():
    plan = LatencyExperiment().plan()
    assert [spec.fleet.profile for spec in plan[::3]] == [
        "custom:5:20",
        "custom:5:20:25",
        "custom:5:20:50",
        "custom:5:20:100",
        "custom:5:20:300",
    ]
    assert {spec.factors["compression"] for spec in plan} == {"none", "fp16", "prune+quantize"}
    assert all(spec.fleet.devices == 4 for spec in plan)
    full = [spec for spec in plan if spec.factors["schedule"] == "full"]
    bounded = [spec for spec in plan if spec.factors["schedule"] == "bounded"]
    # Only the 0 ms runs train to the target; with a delay, two epochs of 8 steps.
    assert {spec.factors["delay_ms"] for spec in full} == {0}
    assert all(spec.option("--max-steps-per-epoch") is None for spec in full)
    assert {spec.option("--max-steps-per-epoch") for spec in bounded} == {"8"}
    # Three epochs to the target: top-k + int8 reaches 0.90 only in its third.
    assert {spec.option("--epochs") for spec in full} == {"3"}
    assert {spec.option("--epochs") for spec in bounded} == {"2"}
    with pytest.raises(ValueError, match="include 0"):
        LatencyExperiment(delays_ms=(25, 50))


def test_latency_bound_delay_is_where_the_added_time_reaches_the_zero_delay_step():
    assert latency_bound_from_ms([(0, 0.1), (25, 0.15), (50, 0.3)]) == pytest.approx(
        25 + 25 * (0.1 - 0.05) / (0.2 - 0.05)
    )
    assert latency_bound_from_ms([(0, 1.0), (300, 1.5)]) is None
    assert latency_bound_from_ms([(25, 1.0)]) is None


def _latency_results(tmp_path: Path, digests: tuple[str, str] = ("w", "w")):
    """Two repeats of: 0 ms to the target (2 x 62 steps), 100 ms and 300 ms bounded (2 x 8)."""
    experiment = LatencyExperiment(delays_ms=(0, 100, 300), compressions=("none",))
    specs = {spec.factors["delay_ms"]: spec for spec in experiment.plan()}
    results = []
    for repeat, second_epoch in ((1, 31.0), (2, 37.2)):  # steady 0.5 and 0.6 s per step
        full = summary(epoch_seconds=[40.0, second_epoch], val_accuracies=[0.85, 0.93], steps=124)
        full["weight_digests"] = ["full", "full"]
        bounded = {
            100: summary(epoch_seconds=[20.0, 8.8], val_accuracies=[0.2, 0.3], steps=16),
            300: summary(epoch_seconds=[30.0, 20.4], val_accuracies=[0.2, 0.3], steps=16),
        }
        for delay, run in ((0, full), *bounded.items()):
            if delay:
                run["weight_digests"] = [digests[0] if delay == 100 else digests[1]] * 2
            result_ = result(specs[delay], run, tmp_dir=tmp_path)
            result_.repeat = repeat
            results.append(result_)
    return experiment, results


def test_latency_table_projects_bounded_runs_from_the_zero_delay_run_with_medians(tmp_path: Path):
    experiment, results = _latency_results(tmp_path)
    table = {row["delay_ms"]: row for row in experiment.aggregate(experiment.rows(results))}
    assert table[0]["steady_step_seconds"] == pytest.approx(0.55)  # median of 0.5 and 0.6
    assert table[0]["seconds_to_target"] == pytest.approx(74.1)  # median of 71 and 77.2
    assert table[0]["steps_to_target"] == 124
    assert table[100]["steady_step_seconds"] == pytest.approx(1.1)  # 8.8 s / 8 steps
    assert table[100]["added_by_delay_seconds"] == pytest.approx(0.55)
    # 0.55 s added over a 0.4 s device round trip: 1.375 round trips per step.
    assert table[100]["round_trips_per_step"] == pytest.approx(1.375)
    assert table[300]["seconds_to_target_projected"] == pytest.approx(74.1 + 124 * (2.55 - 0.55))
    assert "seconds_to_target" not in table[300]
    checks = experiment.targets(list(table.values()), results)
    assert checks[0].met and "from 100 ms per link" in checks[0].measured
    assert checks[-1].met and checks[-1].measured == "2 of 2 codec/schedule groups equal"
    markdown = experiment.extra_markdown(results)
    assert "latency-bound from (ms per link)" in markdown and "| none |" in markdown


def test_latency_steady_step_leaves_the_first_step_and_epoch_ends_out_where_recorded():
    phases = {"compute": 1.0, "exchange": 19.0}
    recorded = {"steps": 16, "phase_seconds": phases, "history": [{"seconds": 30.0}] * 2}
    recorded["rank_totals"] = [
        {"phase_seconds": phases, "first_step_phase_seconds": {"compute": 0.1, "exchange": 4.9}}
    ]
    # 15 s over the 15 steps after the first, not the last epoch's 30 s over 8 steps.
    assert latency_steady_step_seconds(recorded) == pytest.approx(1.0)
    del recorded["rank_totals"]
    assert latency_steady_step_seconds(recorded) == pytest.approx(30.0 / 8)


def test_latency_trajectory_check_fails_when_a_delay_changed_the_weights(tmp_path: Path):
    experiment, results = _latency_results(tmp_path, digests=("a", "b"))
    rows = experiment.aggregate(experiment.rows(results))
    check = experiment.targets(rows, results)[-1]
    assert check.met is False and check.measured == "1 of 2 codec/schedule groups equal"


def test_latency_plot_draws_measured_and_projected_times(tmp_path: Path):
    experiment, results = _latency_results(tmp_path)
    rows = experiment.aggregate(experiment.rows(results))
    (path,) = experiment.plots(rows, results, tmp_path)
    assert path.name == "latency.png" and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_scale_plan_fills_the_machine_and_measures_the_link_while_16_devices_train():
    plan = ScaleExperiment(cores=2).plan()
    assert [(spec.fleet.devices, spec.factors["threads"]) for spec in plan] == [
        (16, "default"),
        (16, "1"),
        (20, "1"),
        (24, "1"),
        (28, "1"),
        (32, "1"),
    ]
    assert all(spec.fleet.cpu_cores_total == pytest.approx(2) for spec in plan)
    assert all(spec.scrape_metrics for spec in plan)
    assert {spec.option("--learning-rate") for spec in plan} == {"0.08"}
    assert plan[1].env == {"TF_NUM_INTRAOP_THREADS": "1", "TF_NUM_INTEROP_THREADS": "1"}
    assert [fault.action for spec in plan for fault in spec.faults] == ["measure"]
    assert plan[1].faults[0].device == 1


def test_scale_rows_report_memory_per_worker_and_the_link_check(tmp_path: Path):
    experiment = ScaleExperiment(device_counts=(2, 3), cores=2)
    specs = experiment.plan()
    resources = {
        f"d{i}": device_resources(f"d{i}", cpu_seconds=1, memory_mb=600 + 10 * i, sent_bytes=1)
        for i in range(2)
    }
    results = [
        result(
            spec,
            summary(epoch_seconds=[5, 5, 5], val_accuracies=[0.3, 0.5, 0.6]),
            resources=resources,
        )
        for spec in specs[:2]
    ]
    results[1].faults = [
        {
            "action": "measure",
            "device": "x-1",
            "result": {
                "round_trip": {"round_trip_ms_median": 72.0, "expected_round_trip_ms": 70.2},
                "rate": {"frame_bits_per_second": 4.8e6, "shaped_bits_per_second": 5e6},
                "emulation_cpu_cores": 0.05,
            },
        }
    ]
    results.append(result(specs[2], None, status="failed (exit 1)"))
    rows = experiment.rows(results)
    assert rows[0]["worker_memory_peak_mb_max"] == pytest.approx(610)
    assert rows[0]["fleet_memory_peak_mb"] == pytest.approx(1210)
    assert rows[1]["link_rate_mbit_per_second"] == pytest.approx(4.8)
    checks = {check.goal.split(" (")[0]: check for check in experiment.targets(rows, results)}
    assert checks["2 devices train LeNet on this machine"].met is True
    assert "2 devices (ok: 2 of 2, 3)" in checks["the largest fleet that still trains"].measured
    link = next(check for check in checks.values() if "delivers its profile" in check.goal)
    assert link.met is True and "-4.0%" in link.measured


def test_sites_plan_is_one_16_device_run_in_4_sites_and_a_flat_comparison():
    sites, flat = SitesExperiment().plan()
    assert (sites.fleet.devices, sites.fleet.sites, sites.fleet.lan, sites.fleet.profile) == (
        16,
        "4x4",
        "lan",
        "lte",
    )
    assert "--sites 4x4 --lan lan --wan lte" in sites.fleet.up_command(
        prefix="x", subnet="10.0.0.0/24", state_dir="/run/x"
    )
    assert flat.fleet.sites is None and flat.fleet.devices == 16
    # 0.01 x 16 diverged in both layouts: 16 devices train at LeNet's cap instead.
    for spec in (sites, flat):
        assert "--no-scale-lr" in spec.train_args and spec.option("--learning-rate") == "0.08"
    assert "at most 0.08" in SitesExperiment().method()
    (quick,) = SitesExperiment(quick=True).plan()
    assert quick.fleet.sites == "2x2" and "--no-scale-lr" not in quick.train_args


def test_latency_scale_and_sites_commands_print_their_plans_and_name_bad_delays():
    from typer.testing import CliRunner

    from globaldl.cli.main import app

    runner = CliRunner()
    latency = runner.invoke(app, ["experiment", "latency", "--dry-run", "--delays-ms", "0,50"])
    assert latency.exit_code == 0, latency.output
    assert "latency: 6 runs" in latency.output, latency.output
    assert "--profile custom:5:20:50" in latency.output
    sites = runner.invoke(app, ["experiment", "sites", "--dry-run", "--quick"])
    assert "--sites 2x2 --lan lan --wan lte" in sites.output, sites.output
    assert (
        "scale: 3 runs"
        in runner.invoke(app, ["experiment", "scale", "--dry-run", "--quick"]).output
    )
    bad = runner.invoke(app, ["experiment", "latency", "--dry-run", "--delays-ms", "0,fast"])
    assert bad.exit_code == 2 and "'fast' is not a number" in bad.output
