"""The `rounds` experiment: its pruned grid, and its targets read from given run numbers."""

from __future__ import annotations

import csv
import itertools
from pathlib import Path
from typing import Any

import pytest
import yaml
from experiment_fakes import result, summary

from globaldl.experiments import RoundsExperiment, write_outputs
from globaldl.experiments.rounds import RECOMMENDED, Variant
from globaldl.settings import resolve_settings


def test_full_plan_covers_both_models_both_fleets_and_every_target_baseline() -> None:
    experiment = RoundsExperiment()
    plan = experiment.plan()
    assert {(s.factors["model"], s.fleet.devices) for s in plan} == {
        ("lenet", 4), ("lenet", 8), ("video", 4), ("video", 8),
    }  # fmt: skip
    labels = {spec.label for spec in plan}
    for model, devices in itertools.product(("lenet", "video"), (4, 8)):
        # Each group can evaluate every target: the recommended rounds, dense per step on the
        # slow link and on the unshaped one.
        for variant in (
            Variant(model, devices, **RECOMMENDED),
            Variant(model, devices),
            Variant(model, devices, shaped=False),
        ):
            assert variant.label in labels
    lenet4 = [s for s in plan if s.factors["model"] == "lenet" and s.fleet.devices == 4]
    rounds = [s.factors for s in lenet4 if s.factors["sync_every"] > 1]
    assert {
        (factors["sync_every"], factors["compression"], factors["overlap"])
        for factors in rounds
        if factors["outer_optimizer"] == "sgd"
    } == set(itertools.product((4, 16, 64), ("none", "prune+quantize"), (False, True))) - {
        (4, "none", False),
        (4, "none", True),
    }
    assert {s.factors["compression"] for s in lenet4 if s.factors["sync_every"] == 1} == {
        "none", "fp16", "prune+quantize",
    }  # fmt: skip
    for spec in plan:
        assert spec.fleet.cpu_cores_total == pytest.approx(2.0)
        assert spec.fleet.profile == ("custom:5:20:50" if spec.factors["shaped"] else
                                      "custom:10000:10000")  # fmt: skip
    assert len(plan) == 31  # one repeat; about two hours on a quiet 2-core machine


@pytest.mark.parametrize("quick", [False, True])
def test_every_run_builds_valid_train_settings(quick: bool, tmp_path: Path) -> None:
    for spec in RoundsExperiment(quick=quick).plan():
        args, settings = list(spec.train_args), {}
        while args:
            name = args.pop(0).removeprefix("--")
            has_value = args and not args[0].startswith("--")
            settings[name] = args.pop(0) if has_value else True
        config = tmp_path / f"{spec.label}.yaml"
        config.write_text(yaml.safe_dump(settings))  # read as `globaldl train` reads a file
        built = resolve_settings({}, config, environ={})
        assert str(built.sync_interval) == str(spec.factors["sync_every"])
        assert built.overlap == spec.factors["overlap"]
        if spec.factors["sync_every"] > 1:
            # Nesterov at DiLoCo's 0.7 / 0.9 (train's own default learning rate is 1); SGD at 1
            # with no momentum, plain model averaging.
            outer = (built.outer_optimizer, built.outer_lr, built.outer_momentum)
            expected = {"nesterov": ("nesterov", 0.7, 0.9), "sgd": ("sgd", 1.0, None)}
            assert outer == expected[spec.factors["outer_optimizer"]], spec.label


def test_a_variant_with_an_unknown_outer_optimizer_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="outer_optimizer 'adam' is not allowed.*nesterov"):
        Variant("lenet", 4, 16, outer_optimizer="adam")


def _summary(seconds: list[float], accuracies: list[float], **rounds: Any) -> dict[str, Any]:
    run = summary(epoch_seconds=seconds, val_accuracies=accuracies, steps=100)
    run["rounds"] = {"examples": 1600, **rounds}
    return run


def test_targets_are_read_from_the_recommended_run_against_its_baselines(tmp_path: Path) -> None:
    experiment = RoundsExperiment(quick=True)
    numbers = {
        # label: epoch seconds, accuracies, rounds fields
        "lenet-n4-step-none": ([100.0, 100.0], [0.93, 0.96], {"wire_bytes_per_sample": 20000.0}),
        "lenet-n4-step-none-unshaped": ([5.0, 5.0], [0.96, 0.97], {}),
        "lenet-n4-h16-prune_quantize-overlap": (
            [4.0, 4.0],
            [0.90, 0.954],
            {"wire_bytes_per_sample": 10.0, "compute_utilisation": 0.9},
        ),
        "lenet-n4-h16-prune_quantize": ([6.0, 6.0], [0.90, 0.94], {}),
    }
    results = []
    for repeat in (1, 2, 3):
        for spec in experiment.plan():
            seconds, accuracies, rounds = numbers[spec.label]
            if repeat == 2 and spec.label == "lenet-n4-step-none":
                seconds = [150.0, 150.0]  # a slower repeat: the target reads the median
            run = result(spec, _summary(seconds, accuracies, **rounds))
            run.repeat = repeat
            results.append(run)
    report = write_outputs(experiment, results, tmp_path)
    checks = {check.goal.split(": ", 1)[1]: check for check in report.targets}
    sooner = next(c for goal, c in checks.items() if "20x sooner" in goal)
    # Medians: 200 s (of 200, 300, 200) against 8 s; the slower repeat widens the range.
    assert sooner.met and sooner.measured.startswith("25.0x [25.0-37.5]")
    unshaped = next(c for goal, c in checks.items() if "within 1.2x" in goal)
    assert unshaped.met is False and unshaped.measured.startswith("1.60x (8.00 s vs 5.00 s")
    payload = next(c for goal, c in checks.items() if "payload bytes" in goal)
    assert payload.met and payload.measured == "2,000x (of medians)"
    interface = next(c for goal, c in checks.items() if "interface" in goal)
    assert interface.met is False  # the fakes' interfaces sent the same bytes for every run
    accuracy = next(c for goal, c in checks.items() if "within 0.5 point" in goal)
    assert accuracy.met is False and accuracy.measured == "0.9540 vs dense 0.9600"
    utilisation = next(c for goal, c in checks.items() if "utilisation" in goal)
    assert utilisation.met and utilisation.measured == "90.0%"
    with (tmp_path / "rounds.csv").open() as stream:
        rows = {row["label"]: row for row in csv.DictReader(stream)}
    assert float(rows["lenet-n4-h16-prune_quantize-overlap"]["seconds_to_target"]) == 8.0
    assert rows["lenet-n4-h16-prune_quantize"]["seconds_to_target"] == "not reached"
    markdown = (tmp_path / "rounds.md").read_text()
    assert "## What the one-round staleness of overlap costs and saves" in markdown
    assert "| lenet | 4 | 16 | prune+quantize | 0.94 | 0.954 | not reached | 8 |" in markdown
    for name in ("rounds.png", "rounds-cost.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_recommended_run_that_never_reaches_the_target_misses_the_unshaped_goal(
    tmp_path: Path,
) -> None:
    experiment = RoundsExperiment(quick=True)
    numbers = {
        "lenet-n4-step-none": ([100.0, 100.0], [0.93, 0.96], {}),
        "lenet-n4-step-none-unshaped": ([5.0, 5.0], [0.96, 0.97], {}),
        "lenet-n4-h16-prune_quantize-overlap": ([4.0, 4.0], [0.90, 0.946], {}),
        "lenet-n4-h16-prune_quantize": ([6.0, 6.0], [0.90, 0.953], {}),
    }
    results = []
    for repeat in (1, 2, 3):
        for spec in experiment.plan():
            seconds, accuracies, rounds = numbers[spec.label]
            run = result(spec, _summary(seconds, accuracies, **rounds))
            run.repeat = repeat
            results.append(run)
    report = write_outputs(experiment, results, tmp_path)
    [unshaped] = [check for check in report.targets if "within 1.2x" in check.goal]
    assert unshaped.met is False
    assert unshaped.measured == "not reached by the rounds run; unshaped 5.00 s"
