"""The chaos experiment: its seeded trial schedule, its plan, and the metrics read from events."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from experiment_fakes import result, summary
from typer.testing import CliRunner

from globaldl.cli.experiment import app
from globaldl.experiments.chaos import (
    COMMIT_EVERY,
    DEVICES,
    MIN_TRIALS,
    ChaosExperiment,
)
from globaldl.experiments.chaos_trials import (
    compute_utilisation,
    measure_trials,
    split_trials,
    step_utilisation,
    trial_faults,
    trial_schedule,
)
from globaldl.experiments.spec import RunSpec


def test_the_schedule_is_seeded_and_never_kills_device_1() -> None:
    schedule = trial_schedule(40, 4, seed=7)
    assert schedule == trial_schedule(40, 4, seed=7)
    assert schedule != trial_schedule(40, 4, seed=8)
    assert {trial.device for trial in schedule} == {2, 3, 4}
    assert all(5.0 <= trial.kill_delay_seconds <= 25.0 for trial in schedule)
    assert all(3.0 <= trial.revive_delay_seconds <= 15.0 for trial in schedule)


@pytest.mark.parametrize(
    ("trials", "devices", "message"),
    [(0, 4, "at least 1 trial, got 0"), (3, 2, "at least 3 devices.*got 2")],
)
def test_a_schedule_that_cannot_run_is_refused_with_the_value(
    trials: int, devices: int, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        trial_schedule(trials, devices, seed=0)


def test_trials_split_into_runs_and_become_kill_then_revive_faults() -> None:
    schedule = trial_schedule(7, 4, seed=0)
    runs = split_trials(schedule, 3)
    assert [len(run) for run in runs] == [3, 3, 1]
    assert [trial for run in runs for trial in run] == schedule
    faults = trial_faults(runs[0], 4)
    assert [fault.action for fault in faults] == ["kill", "revive"] * 3
    assert [fault.device for fault in faults[::2]] == [trial.device for trial in runs[0]]
    # The first kill waits for training; later kills for the ring grown back to 4 devices;
    # revives for the survivors' ring of 3.
    assert faults[0].after_line == r"epoch 1/"
    assert faults[2].after_line == r"elastic: 4 workers now \(was 3\)"
    assert faults[1].after_line == r"elastic: 3 workers now \(was 4\)"
    assert faults[0].delay_seconds == runs[0][0].kill_delay_seconds


def test_the_full_plan_has_20_trials_in_runs_beside_an_undisturbed_run() -> None:
    experiment = ChaosExperiment()
    specs = experiment.plan()
    assert [spec.label for spec in specs] == ["undisturbed", *(f"chaos-{i}" for i in range(1, 5))]
    kills = [f for spec in specs for f in spec.faults if f.action == "kill"]
    assert len(kills) == MIN_TRIALS
    for spec in specs:
        assert spec.fleet.devices == DEVICES
        assert spec.fleet_run_args[:3] == ("--elastic", "--min-np", "2")
        assert spec.env == {
            "GLOBALDL_GLOO_JOIN_TIMEOUT_SECONDS": "60",
            "GLOBALDL_GLOO_COLLECTIVE_TIMEOUT_SECONDS": "10",
        }
        assert spec.option("--prune") == "topk" and spec.option("--quantize") == "int8"
        assert spec.option("--commit-every") == str(COMMIT_EVERY)
        assert spec.train_args == specs[0].train_args
    assert RunSpec.from_config(specs[1].get_config()) == specs[1]
    shorter = ChaosExperiment(collective_timeout_seconds=5).plan()[1]
    assert shorter.env["GLOBALDL_GLOO_COLLECTIVE_TIMEOUT_SECONDS"] == "5"


def _kill(device: str, at: float) -> dict[str, Any]:
    return {"action": "kill", "device": device, "at": at, "done_at": at + 0.2}


def _revive(device: str, at: float, done: float) -> dict[str, Any]:
    return {"action": "revive", "device": device, "at": at, "done_at": done}


def _event(
    reason: str, detected: float, first_step: float | None, before: int, after: int, lost: int
) -> dict[str, Any]:
    return {
        "reason": reason,
        "detected_at": detected,
        "first_step_at": first_step,
        "size_before": before,
        "size_after": after,
        "lost_steps": lost,
        "step": 0,
    }


FAULTS = [
    _kill("gdlx-3", 100.0),
    _revive("gdlx-3", 130.0, 133.0),
    _kill("gdlx-2", 200.0),
    _revive("gdlx-2", 240.0, 242.0),
]
EVENTS = [
    _event("failure", 110.5, 118.0, 4, 3, 7),
    _event("hosts_changed", 134.0, 160.0, 3, 4, 0),
    # The second kill noticed at a commit (a removal), before any collective failed.
    _event("hosts_changed", 203.0, 209.0, 4, 3, 0),
    _event("hosts_changed", 243.0, 270.0, 3, 4, 0),
]


def test_trial_metrics_come_from_fault_times_and_elastic_events() -> None:
    first, second = measure_trials(FAULTS, EVENTS, run_finished=True)
    assert first.device == "gdlx-3"
    assert first.seconds_kill_to_detect == pytest.approx(10.5)
    assert first.seconds_kill_to_next_step == pytest.approx(18.0)
    assert first.lost_steps == 7
    assert first.seconds_revive_to_first_step == pytest.approx(27.0)
    assert first.as_row()["seconds_detect_to_next_step"] == pytest.approx(7.5)
    assert second.seconds_kill_to_next_step == pytest.approx(9.0)
    assert second.lost_steps == 0
    assert second.seconds_revive_to_first_step == pytest.approx(28.0)
    assert not first.hang and not second.hang


def test_a_kill_without_a_next_step_is_a_hang_only_when_the_run_did_not_finish() -> None:
    events = EVENTS[:2]  # nothing after the second kill
    stalled = measure_trials(FAULTS, events, run_finished=False)
    assert [trial.hang for trial in stalled] == [False, True]
    assert stalled[1].seconds_kill_to_next_step is None
    ended = measure_trials(FAULTS, events, run_finished=True)
    assert [trial.hang for trial in ended] == [False, False]
    # A fault the fleet failed to carry out is not a trial.
    failed_kill = [{**FAULTS[0], "error": "no such device"}]
    assert measure_trials(failed_kill, EVENTS, run_finished=True) == []


def test_utilisations_are_compute_and_step_seconds_over_wall_seconds() -> None:
    run = {"wall_seconds": 200.0, "phase_seconds": {"compute": 50.0, "exchange": 70.0}}
    assert compute_utilisation(run) == 0.25
    assert step_utilisation(run) == 0.6
    assert compute_utilisation({"wall_seconds": 0.0, "phase_seconds": {"compute": 1.0}}) is None
    assert step_utilisation({"wall_seconds": 10.0}) is None


def test_rows_and_targets_judge_hangs_losses_time_and_accuracy() -> None:
    experiment = ChaosExperiment(trials=2, trials_per_run=2)
    undisturbed_spec, chaos_spec = experiment.plan()
    reference = result(
        undisturbed_spec, summary(epoch_seconds=[5.0] * 3, val_accuracies=[0.95] * 3, ranks=4)
    )
    chaos_summary = summary(epoch_seconds=[5.0] * 3, val_accuracies=[0.945] * 3, ranks=4)
    chaos_summary["elastic"] = {"sizes": [4, 3, 4, 3, 4], "lost_steps": 7, "events": EVENTS}
    chaos = result(chaos_spec, chaos_summary)
    chaos.faults = FAULTS
    rows = experiment.rows([reference, chaos])
    assert rows[1]["trials"] == 2 and rows[1]["hangs"] == 0
    assert rows[1]["max_lost_steps"] == 7
    assert rows[1]["max_seconds_kill_to_next_step"] == pytest.approx(18.0)
    checks = {check.goal: check.met for check in experiment.targets(rows, [reference, chaos])}
    assert list(checks.values()) == [False, True, True, True, True]  # 2 trials, not 20
    rows[1]["val_accuracy"] = 0.93
    accuracy = experiment.targets(rows, [reference, chaos])[-1]
    assert accuracy.met is False
    slow = [dict(EVENTS[0], first_step_at=135.0), *EVENTS[1:]]
    chaos.summary = dict(chaos_summary, elastic={**chaos_summary["elastic"], "events": slow})
    assert experiment.targets(rows, [reference, chaos])[3].met is False  # 35 s > 30 s


def test_the_cli_default_profile_is_the_experiments():
    """The CLI keeps its defaults as text (no experiment import at start-up): they must agree."""
    import inspect

    from globaldl.cli.experiment.chaos import chaos
    from globaldl.experiments.chaos import DEFAULT_PROFILE

    assert inspect.signature(chaos).parameters["profile"].default == DEFAULT_PROFILE
    assert ChaosExperiment().fleet.profile == DEFAULT_PROFILE


def test_kills_count_over_every_repeat_against_the_schedule_times_the_repeats() -> None:
    experiment = ChaosExperiment(trials=2, trials_per_run=2)
    undisturbed_spec, chaos_spec = experiment.plan()
    runs = []
    for repeat in (1, 2, 3):
        chaos_summary = summary(epoch_seconds=[5.0] * 3, val_accuracies=[0.945] * 3, ranks=4)
        chaos_summary["elastic"] = {"sizes": [4, 3, 4, 3, 4], "lost_steps": 7, "events": EVENTS}
        chaos = replace(result(chaos_spec, chaos_summary), repeat=repeat)
        chaos.faults = FAULTS
        runs.append(chaos)
    reference = result(
        undisturbed_spec, summary(epoch_seconds=[5.0] * 3, val_accuracies=[0.95] * 3, ranks=4)
    )
    rows = experiment.rows([reference, runs[0]])
    trials = experiment.targets(rows, [reference, *runs])[0]
    assert trials.measured == "6 kills done of 6 planned (2 per repeat x 3 repeats)"
    assert trials.met is False  # 6 < 20
    one = experiment.targets(rows, [reference, runs[0]])[0]
    assert one.measured == "2 kills done of 2 planned (2 per repeat x 1 repeat)"


def test_chaos_dry_run_plans_without_touching_the_system(tmp_path: Path) -> None:
    out = tmp_path / "out"
    outcome = CliRunner().invoke(
        app,
        [
            "chaos",
            "--dry-run",
            "--trials",
            "6",
            "--trials-per-run",
            "4",
            "--collective-timeout-seconds",
            "5",
            "--out",
            str(out),
        ],
    )
    assert outcome.exit_code == 0, outcome.output
    assert "chaos: 3 runs" in outcome.output  # undisturbed + 2 chaos runs (4 + 2 trials)
    assert "x 3 repeats, interleaved = 9 runs" in outcome.output
    assert outcome.output.count("globaldl fleet up -n 4 --profile custom:5:17.5 --cpu 0.5") == 1
    assert "--epochs 22" in outcome.output  # 2 + 5 per trial of the longest run
    assert not out.exists()
    too_long = CliRunner().invoke(app, ["chaos", "--dry-run", "--collective-timeout-seconds", "60"])
    assert too_long.exit_code == 2 and "collective timeout must be 1..59 s" in too_long.output


def test_a_report_rebuilds_the_experiment_with_the_options_its_runs_had() -> None:
    from globaldl.cli.experiment.report import recorded_options

    document = {"experiment": ChaosExperiment(trials=7, trials_per_run=7).get_config()}
    options = recorded_options("chaos", document)
    # Derived entries (epochs, the schedule) are rebuilt from the options; quick stays the CLI's.
    assert options == {
        "cycle_time_ms": None,
        "profile": "custom:5:17.5",
        "trials": 7,
        "trials_per_run": 7,
        "seed": 0,
        "collective_timeout_seconds": 10,
    }
    assert ChaosExperiment(**options).schedule == ChaosExperiment(trials=7).schedule
    assert recorded_options("chaos", {"experiment": {"name": "latency", "trials": 7}}) == {}
    assert recorded_options("nope", document) == {}
