"""The `learning` experiment: one budget for calibration and fleet, and its 1-point targets."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from experiment_fakes import result, summary

from globaldl.experiments import LearningExperiment, RunSpec, write_outputs


def _options(spec: RunSpec) -> dict[str, str]:
    args = list(spec.train_args)
    return {args[i]: args[i + 1] for i in range(0, len(args), 2)}


def test_calibration_and_fleet_get_the_same_epochs_schedule_and_global_batch() -> None:
    experiment = LearningExperiment()
    plan = experiment.plan()
    assert [spec.label for spec in plan] == [
        "resnet-8-calibration-dense-1",
        "video-calibration-dense-1",
        "resnet-8-fleet-prune_quantize-4",
        "video-fleet-prune_quantize-4",
        "video-fleet-dgc_quantize-4",
    ]
    assert {spec.fleet.profile for spec in plan} == {"lan"}  # the link changes time, not learning
    for model in ("resnet-8", "video"):
        calibration, fleet, *_ = (_options(spec) for spec in plan if spec.factors["model"] == model)
        for option in ("--model", "--dataset", "--epochs", "--lr-warmup-epochs", "--lr-decay"):
            assert calibration[option] == fleet[option], option
        assert calibration["--lr-decay"] == "cosine"
        # One process at the global batch and the rate the 4 devices reach by scaling.
        assert int(calibration["--batch-size"]) == 4 * int(fleet["--batch-size"])
        assert float(calibration["--learning-rate"]) == pytest.approx(
            4 * float(fleet["--learning-rate"])
        )
        assert "--prune" not in calibration and "--quantize" not in calibration
        assert (fleet["--prune"], fleet["--density"], fleet["--quantize"]) == (
            "topk",
            "0.01",
            "int8",
        )
    # The video model's second fleet: deep gradient compression with its warm-up, then int8.
    dgc = _options(plan[-1])
    assert (dgc["--prune"], dgc["--density"], dgc["--warmup-epochs"], dgc["--quantize"]) == (
        "dgc",
        "0.01",
        "2",
        "int8",
    )
    assert plan[-1].factors["compression"] == "dgc+quantize"
    calibration_fleet, device_fleet = plan[0].fleet, plan[-1].fleet
    assert (calibration_fleet.devices, device_fleet.devices) == (1, 4)
    # The calibration does the fleet's work alone, with the fleet's cores.
    assert calibration_fleet.cpu_cores_total == pytest.approx(device_fleet.cpu_cores_total)


def _learning_results(calibrated: float, reached: float, identical: bool = True) -> list:
    plan = LearningExperiment(quick=True).plan()
    runs = []
    for spec, accuracy in zip(plan, (calibrated, reached), strict=True):
        run = summary(epoch_seconds=[5.0, 5.0], val_accuracies=[0.5, accuracy])
        run["weights_identical"] = identical
        runs.append(result(spec, run))
    return runs


@pytest.mark.parametrize(
    ("reached", "status"),
    [(0.955, "met"), (0.975, "met"), (0.949, "NOT met")],
)
def test_fleet_meets_the_target_within_one_point_below_the_calibration_only(
    tmp_path: Path, reached: float, status: str
) -> None:
    experiment = LearningExperiment(quick=True)
    report = write_outputs(experiment, _learning_results(0.96, reached), tmp_path)
    checks = {check.goal: check for check in report.targets}
    within = checks[
        "resnet-8: 4 devices with prune+quantize within 1 point of the calibrated target"
    ]
    assert within.status == status
    assert "target 0.9600" in within.measured
    assert checks[
        "resnet-8: the 1-process dense calibration learns (final val_accuracy above 0.8)"
    ].met
    fleet_row = next(row for row in report.rows if row["role"] == "fleet")
    assert fleet_row["target_accuracy"] == 0.96
    assert fleet_row["points_below_target"] == pytest.approx(100 * (0.96 - reached))
    assert (tmp_path / "learning.png").stat().st_size > 0
    assert json.loads((tmp_path / "learning.json").read_text())["targets"]


def test_a_calibration_that_did_not_learn_and_diverged_weights_are_reported() -> None:
    experiment = LearningExperiment(quick=True)
    results = _learning_results(0.3, 0.3, identical=False)
    rows = experiment.rows(results)
    status = {check.goal: check.status for check in experiment.targets(rows, results)}
    assert (
        status["resnet-8: the 1-process dense calibration learns (final val_accuracy above 0.8)"]
        == "NOT met"
    )
    assert (
        status["resnet-8: every device ends with identical weights (prune+quantize)"] == "NOT met"
    )


def test_without_a_calibration_run_the_fleet_target_is_not_evaluated() -> None:
    experiment = LearningExperiment(quick=True)
    results = _learning_results(0.96, 0.96)[1:]
    rows = experiment.rows(results)
    status = {check.goal: check.status for check in experiment.targets(rows, results)}
    assert (
        status["resnet-8: 4 devices with prune+quantize within 1 point of the calibrated target"]
        == "not evaluated"
    )


def test_each_fleet_compression_of_a_workload_is_judged_against_the_one_calibration() -> None:
    from globaldl.experiments.learning import VIDEO_LEARNING

    experiment = LearningExperiment(quick=True, workloads=(VIDEO_LEARNING,))
    plan = experiment.plan()
    assert [spec.factors["compression"] for spec in plan] == [
        "none",
        "prune+quantize",
        "dgc+quantize",
    ]
    runs = []
    for spec, accuracy in zip(plan, (0.9, 0.79, 0.895), strict=True):
        run = summary(epoch_seconds=[5.0, 5.0], val_accuracies=[0.5, accuracy])
        run["weights_identical"] = True
        runs.append(result(spec, run))
    rows = experiment.rows(runs)
    status = {check.goal: check.status for check in experiment.targets(rows, runs)}
    within = "video: 4 devices with {} within 1 point of the calibrated target"
    assert status[within.format("prune+quantize")] == "NOT met"
    assert status[within.format("dgc+quantize")] == "met"
    # Without its run, a compression is not evaluated; the other keeps its verdict.
    status = {check.goal: check.status for check in experiment.targets(rows[:2], runs[:2])}
    assert status[within.format("dgc+quantize")] == "not evaluated"
    assert status["video: every device ends with identical weights (dgc+quantize)"] == (
        "not evaluated"
    )


def test_a_workload_naming_an_unknown_compression_is_refused_with_the_choices() -> None:
    from globaldl.experiments.learning import LearningWorkload

    with pytest.raises(ValueError, match=r"compressions \['zip'\] are not among prune"):
        LearningWorkload(
            "x", (), epochs=2, lr_warmup_epochs=1, learns_above=0.5, compressions=("zip",)
        )
