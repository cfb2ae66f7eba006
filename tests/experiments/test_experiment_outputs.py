"""CSV, markdown, JSON and PNG outputs, table rows and target checks, from given run results."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from experiment_fakes import device_resources, result, summary

from globaldl.experiments import (
    AblationExperiment,
    BottleneckExperiment,
    DevicesExperiment,
    ResourcesExperiment,
    write_outputs,
)
from globaldl.experiments.outputs import write_csv

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _read_csv(path: Path) -> list[dict[str, str]]:
    with path.open() as stream:
        return list(csv.DictReader(stream))


def _assert_png(path: Path) -> None:
    data = path.read_bytes()
    assert data.startswith(PNG_SIGNATURE) and len(data) > 2000, path


def test_write_csv_keeps_every_column_and_leaves_missing_cells_empty(tmp_path: Path) -> None:
    path = write_csv(
        tmp_path / "out" / "t.csv",
        [{"a": 1, "b": None}, {"a": 2.5, "c": "not reached", "d": ["--x", "1"]}],
    )
    assert _read_csv(path) == [
        {"a": "1", "b": "", "c": "", "d": ""},
        {"a": "2.5", "b": "", "c": "not reached", "d": "--x 1"},
    ]
    assert [p.name for p in path.parent.iterdir()] == ["t.csv"]  # no temporary files left


def _devices_results(compressed_seconds_to_target: dict[int, float]) -> list:
    """Fake runs of a quick devices plan; time per epoch falls with N for every config."""
    results = []
    for spec in DevicesExperiment(quick=True).plan():
        n = spec.fleet.devices
        if spec.factors["compression"] == "prune+quantize":
            reach = compressed_seconds_to_target[n]
            run = summary(epoch_seconds=[reach, reach], val_accuracies=[0.91, 0.95])
        else:
            run = summary(epoch_seconds=[60.0 / n, 60.0 / n], val_accuracies=[0.5, 0.6])
        results.append(result(spec, run))
    return results


def test_devices_outputs_rows_targets_and_plot(tmp_path: Path) -> None:
    experiment = DevicesExperiment(quick=True)
    results = _devices_results({1: 40.0, 2: 25.0, 4: 15.0})
    report = write_outputs(experiment, results, tmp_path, command="globaldl experiment devices")
    names = sorted(path.name for path in report.paths)
    assert names == ["devices-runs.csv", "devices.csv", "devices.json", "devices.md", "devices.png"]
    _assert_png(tmp_path / "devices.png")

    rows = {row["label"]: row for row in _read_csv(tmp_path / "devices.csv")}
    assert float(rows["lenet-n2-prune_quantize"]["seconds_to_target"]) == pytest.approx(25.0)
    assert rows["lenet-n2-none"]["seconds_to_target"] == "not reached"
    assert float(rows["lenet-n4-none"]["seconds_per_epoch"]) == pytest.approx(15.0)
    assert "--max-steps-per-epoch 12" in rows["lenet-n4-none"]["train_command"]
    assert rows["lenet-n4-none"]["horovod_cycle_time_ms"] == "20.0"

    status = {check.goal: check.status for check in report.targets}
    assert status == {
        "lenet, none: time per epoch falls at every step from 1 to 4 devices": "met",
        "lenet, prune+quantize: time per epoch falls at every step from 1 to 4 devices": "met",
        "lenet, prune+quantize: time to val_accuracy 0.9 falls at every step from 1 to 4 "
        "devices": "met",
    }
    markdown = (tmp_path / "devices.md").read_text()
    assert "| model | compression | devices |" in markdown
    assert "Delay is NOT emulated" in markdown
    assert (
        "| lenet, prune+quantize: time to val_accuracy 0.9 falls at every step from 1 to 4 "
        "devices | met |" in markdown
    )
    # One repeat: the markdown says these are not benchmark results.
    assert "Fewer than 3 repeats" in markdown
    assert "![devices](devices.png)" in markdown
    document = json.loads((tmp_path / "devices.json").read_text())
    assert len(document["runs"]) == 6 and document["complete"] is True
    assert document["experiment"]["device_counts"] == [1, 2, 4]


def test_devices_target_is_not_met_when_more_devices_take_longer(tmp_path: Path) -> None:
    report = write_outputs(
        DevicesExperiment(quick=True), _devices_results({1: 10.0, 2: 25.0, 4: 40.0}), tmp_path
    )
    checks = {check.goal: check for check in report.targets}
    check = checks[
        "lenet, prune+quantize: time to val_accuracy 0.9 falls at every step from 1 to 4 devices"
    ]
    assert check.met is False and "1: 10.0 s, 2: 25.0 s, 4: 40.0 s" in check.measured


def test_a_failed_run_keeps_its_row_and_status_and_is_reported(tmp_path: Path) -> None:
    experiment = DevicesExperiment(quick=True)
    results = _devices_results({1: 40.0, 2: 25.0, 4: 15.0})
    results[-1] = result(results[-1].spec, None, status="failed (exit 1)")
    report = write_outputs(experiment, results, tmp_path, complete=False)
    assert [r.spec.label for r in report.failed_runs] == ["lenet-n4-prune_quantize"]
    rows = {row["label"]: row for row in _read_csv(tmp_path / "devices.csv")}
    assert rows["lenet-n4-prune_quantize"]["status"] == "failed (exit 1)"
    assert rows["lenet-n4-prune_quantize"]["val_accuracy"] == ""
    assert "**Incomplete**: 6 of 6 runs" in (tmp_path / "devices.md").read_text()


def _ablation_results(seconds_to_target: dict[str, float | None], step_seconds: dict[str, float]):
    results = []
    for spec in AblationExperiment(quick=True).plan():
        variant = spec.factors["variant"]
        reach = seconds_to_target.get(variant)
        accuracies = [0.95, 0.96] if reach is not None else [0.5, 0.6]
        epoch = reach if reach is not None else 200.0
        steps = 20
        run = summary(
            epoch_seconds=[epoch, epoch],
            val_accuracies=accuracies,
            steps=steps,
            phase_seconds={
                "compute": step_seconds[variant] * steps / 2,
                "exchange": step_seconds[variant] * steps / 2,
            },
        )
        results.append(result(spec, run, cycle_time_ms=spec.cycle_time_ms))
    return results


def test_ablation_targets_are_evaluated_against_the_factors(tmp_path: Path) -> None:
    steps = {
        "none": 1.0,
        "fp16": 0.6,
        "prune+quantize": 0.12,
        "prune+quantize (cycle 1 ms)": 0.30,
        "prune+quantize (unshaped)": 0.10,
    }
    results = _ablation_results(
        {
            "none": 150.0,
            "fp16": 30.0,
            "prune+quantize": 10.0,
            "prune+quantize (cycle 1 ms)": 25.0,
            "prune+quantize (unshaped)": 9.0,
        },
        steps,
    )
    report = write_outputs(AblationExperiment(quick=True), results, tmp_path)
    checks = [(check.goal, check.met) for check in report.targets]
    assert checks == [
        ("prune+quantize reaches val_accuracy 0.9 >= 10x sooner than none (custom:5:20)", True),
        ("prune+quantize reaches val_accuracy 0.9 >= 5x sooner than fp16 (custom:5:20)", False),
        ("prune+quantize mean step time on custom:5:20 <= 1.5x the unshaped link's", True),
        (
            "prune+quantize at the automatic HOROVOD_CYCLE_TIME (5 ms) steps no slower than at "
            "1 ms (custom:5:20)",
            True,
        ),
    ]
    rows = {row["variant"]: row for row in _read_csv(tmp_path / "ablation.csv")}
    assert float(rows["none"]["mean_step_seconds"]) == pytest.approx(1.0)
    assert float(rows["none"]["exchange_share"]) == pytest.approx(0.5)
    assert rows["prune+quantize (cycle 1 ms)"]["horovod_cycle_time_ms"] == "1.0"
    _assert_png(tmp_path / "ablation.png")


def test_ablation_speedup_is_bounded_when_the_baseline_never_reaches_the_target(
    tmp_path: Path,
) -> None:
    steps = dict.fromkeys(
        [
            "none",
            "fp16",
            "prune+quantize",
            "prune+quantize (cycle 1 ms)",
            "prune+quantize (unshaped)",
        ],
        0.5,
    )
    results = _ablation_results({"prune+quantize": 10.0, "fp16": 20.0}, steps)
    report = write_outputs(AblationExperiment(quick=True), results, tmp_path)
    versus_none = report.targets[0]
    # none trained 400 s without reaching 0.9: at least 40x.
    assert versus_none.met is True and versus_none.measured.startswith("> 40.0x")


def test_bottleneck_rows_name_the_dominant_phase_and_draw_a_heatmap(tmp_path: Path) -> None:
    results = []
    for spec in BottleneckExperiment(quick=True).plan():
        exchange = 9.0 if spec.fleet.profile == "slow-4g" else 1.0
        run = summary(
            epoch_seconds=[5.0],
            val_accuracies=[0.3],
            phase_seconds={"compute": 3.0, "exchange": exchange, "data_load": 0.5},
        )
        results.append(result(spec, run))
    write_outputs(BottleneckExperiment(quick=True), results, tmp_path)
    rows = _read_csv(tmp_path / "bottleneck.csv")
    assert {(r["profile"], r["bottleneck_phase"]) for r in rows} == {
        ("fibre", "compute"),
        ("slow-4g", "exchange"),
    }
    slow = next(r for r in rows if r["profile"] == "slow-4g")
    assert float(slow["bottleneck_share"]) == pytest.approx(9.0 / 12.5)
    assert sum(
        float(slow[f"share_{p}"])
        for p in ("data_load", "compute", "compress", "exchange", "decompress", "apply")
    ) == (pytest.approx(1.0))
    _assert_png(tmp_path / "bottleneck.png")


def test_resources_rows_average_devices_and_keep_a_per_device_table(tmp_path: Path) -> None:
    results = []
    for spec in ResourcesExperiment(quick=True).plan():
        layers = int(spec.option("--layers"))
        resources = {
            name: device_resources(
                name, cpu_seconds=cpu, memory_mb=300 + 10 * layers, sent_bytes=1e6 * layers
            )
            for name, cpu in (("gdlx-1", 2.0), ("gdlx-2", 3.0))
        }
        results.append(
            result(spec, summary(epoch_seconds=[10.0], val_accuracies=[0.4]), resources=resources)
        )
    report = write_outputs(ResourcesExperiment(quick=True), results, tmp_path)
    assert tmp_path / "resources-devices.csv" in report.paths
    rows = {row["label"]: row for row in _read_csv(tmp_path / "resources.csv")}
    row = rows["mlp-l5-b16"]
    assert float(row["cpu_percent_of_device"]) == pytest.approx(50.0)  # (40 % + 60 %) / 2
    assert float(row["cpu_cores_used"]) == pytest.approx(0.25)
    assert float(row["memory_peak_mb"]) == pytest.approx(350.0)
    assert float(row["network_sent_kb"]) == pytest.approx(5000.0)
    assert float(row["interface_sent_kb"]) == pytest.approx(5.0)
    per_device = _read_csv(tmp_path / "resources-devices.csv")
    assert len(per_device) == 2 * len(results)
    markdown = (tmp_path / "resources.md").read_text()
    assert "## Per device" in markdown and "globaldl's own exporter, scraped" in markdown
    _assert_png(tmp_path / "resources.png")


def test_run_results_round_trip_and_report_rebuilds_the_tables_without_a_fleet(
    tmp_path: Path,
) -> None:
    from typer.testing import CliRunner

    from globaldl.cli.experiment import app
    from globaldl.experiments import RunResult
    from globaldl.files import write_json_atomically

    plan = BottleneckExperiment(quick=True).plan()
    for spec in plan[:3]:  # the fourth run never finished
        original = result(
            spec,
            summary(epoch_seconds=[5.0], val_accuracies=[0.3]),
            resources={
                "gdlx-1": device_resources("gdlx-1", cpu_seconds=1.0, memory_mb=300, sent_bytes=1e5)
            },
            tmp_dir=tmp_path / "runs",
        )
        assert RunResult.from_dict(original.to_dict()).to_dict() == original.to_dict()
        (tmp_path / "runs" / spec.label).mkdir(parents=True)
        write_json_atomically(tmp_path / "runs" / spec.label / "result.json", original.to_dict())

    completed = CliRunner().invoke(app, ["report", "bottleneck", "--quick", "--out", str(tmp_path)])
    assert completed.exit_code == 0, completed.output
    assert "bottleneck: 3 runs, 3 of 4 labels of the plan" in completed.output
    assert [row["label"] for row in _read_csv(tmp_path / "bottleneck.csv")] == [
        spec.label for spec in plan[:3]
    ]
    assert "**Incomplete**: 3 of 4 runs" in (tmp_path / "bottleneck.md").read_text()
    empty = CliRunner().invoke(app, ["report", "ablation", "--out", str(tmp_path / "none")])
    assert empty.exit_code == 2 and "no run results of ablation" in empty.output


def test_runs_from_two_machines_are_listed_by_machine_and_one_machine_heads_the_table(
    tmp_path: Path,
) -> None:
    from dataclasses import replace

    from globaldl.experiments.results import load_results

    plan = BottleneckExperiment(quick=True).plan()
    older = {"cpu": "AMD EPYC", "cores": 2}
    newer = {"cpu": "Intel Xeon", "cores": 2}
    runs = [
        replace(result(spec, summary(epoch_seconds=[5.0], val_accuracies=[0.3])), machine=m)
        for spec, m in zip(plan[:3], (older, older, newer), strict=True)
    ]
    write_outputs(BottleneckExperiment(quick=True), runs, tmp_path)
    text = (tmp_path / "bottleneck.md").read_text()
    assert "Machine: runs taken on 2 machines (see Machines below)." in text
    assert f"1. cpu AMD EPYC, cores 2: {plan[0].label}/repeat-1, {plan[1].label}/repeat-1" in text
    assert f"2. cpu Intel Xeon, cores 2: {plan[2].label}/repeat-1" in text
    document = json.loads((tmp_path / "bottleneck.json").read_text())
    assert [machine["cpu"] for machine in document["machines"]] == ["AMD EPYC", "Intel Xeon"]
    # One machine: it heads the table, whatever machine writes the report.
    write_outputs(BottleneckExperiment(quick=True), runs[:2], tmp_path / "one")
    one = (tmp_path / "one" / "bottleneck.md").read_text()
    assert "Machine: cpu AMD EPYC, cores 2." in one and "## Machines" not in one
    # Runs of a NAME.json recorded before runs carried their machine take the document's.
    document = json.loads((tmp_path / "one" / "bottleneck.json").read_text())
    for run in document["runs"]:
        run["machine"] = None
    (tmp_path / "one" / "bottleneck.json").write_text(json.dumps(document))
    loaded = load_results(tmp_path / "one", plan, name="bottleneck")
    assert [run.machine for run in loaded] == [older, older]
