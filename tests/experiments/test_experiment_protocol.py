"""The benchmark protocol: interleaved repeats, medians with min-max, busy runs, honest ETA."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
from experiment_fakes import result, summary
from typer.testing import CliRunner

from globaldl.experiments import AblationExperiment, DevicesExperiment, write_outputs
from globaldl.experiments.aggregate import aggregate_rows, presented, row_spread
from globaldl.experiments.analysis import Spread, at_most_times
from globaldl.experiments.load import BusyLimits, MachineLoad
from globaldl.experiments.progress import RunClock, interleave
from globaldl.experiments.results import RunResult, portable
from globaldl.experiments.runner import ExperimentRunner


def _load(busy: bool) -> MachineLoad:
    return MachineLoad(
        seconds=100.0, cores=2, machine_cpu_seconds=150.0, devices_cpu_seconds=100.0,
        emulation_cpu_seconds=0.0, driver_cpu_seconds=5.0,
        outside_cpu_seconds=45.0 if busy else 1.0, outside_cores_peak=0.9 if busy else 0.02,
        load_average_1m_start=1.0, load_average_1m_max=2.5, busy=busy,
        busy_reason="0.45 cores used outside the fleet on average (limit 0.1)" if busy else "",
    )  # fmt: skip


def test_repeats_are_interleaved_repeat_by_repeat_in_plan_order() -> None:
    plan = AblationExperiment(quick=True).plan()[:3]
    schedule = interleave(plan, 3)
    assert [(run.spec.label, run.repeat) for run in schedule] == [
        (spec.label, repeat) for repeat in (1, 2, 3) for spec in plan
    ]
    with pytest.raises(ValueError, match="repeats must be a whole number >= 1, got 0"):
        interleave(plan, 0)


def test_the_estimate_says_what_it_rests_on() -> None:
    plan = AblationExperiment(quick=True).plan()[:2]
    a, b = plan[0].label, plan[1].label
    schedule = interleave(plan, 2)
    clock = RunClock(schedule)
    assert clock.eta_text(schedule) == "ETA unknown until the first run finishes"
    clock.finished(schedule[0], 100.0)
    assert clock.eta_text(schedule[1:]) == (
        "ETA ~5m00s (2 runs not timed yet, counted at the mean run)"
    )
    clock.finished(schedule[1], 20.0)
    assert clock.eta_text(schedule[2:]) == "ETA 2m00s"  # each label's own earlier repeat
    seeded = RunClock(schedule, {a: 60.0, b: 30.0})
    assert seeded.eta_text(schedule) == "ETA ~3m00s (4 of them as an earlier session timed them)"
    assert clock.position(schedule[3]) == f"[4/4] ablation {b} (repeat 2/2)"


def test_repeats_fold_into_medians_with_ranges_and_not_reached_sorts_last() -> None:
    never = "not reached"
    rows = [
        {"label": "a", "repeat": 1, "status": "ok", "devices": 4, "step": 1.0, "reach": 10.0},
        {"label": "a", "repeat": 2, "status": "ok", "devices": 4, "step": 3.0, "reach": never},
        {"label": "a", "repeat": 3, "status": "ok", "devices": 4, "step": 2.0, "reach": 12.0,
         "machine_busy": True},
        {"label": "b", "repeat": 1, "status": "failed (exit 1)", "devices": 4},
        {"label": "b", "repeat": 2, "status": "ok", "devices": 4, "step": 5.0, "reach": never},
    ]  # fmt: skip
    a, b = aggregate_rows(rows)
    assert (a["step"], a["step_min"], a["step_max"]) == (2.0, 1.0, 3.0)
    assert (a["reach"], a["reach_min"], a["reach_max"]) == (12.0, 10.0, "not reached")
    assert (a["devices"], a["repeats"], a["busy_repeats"], a["status"]) == (4, 3, 1, "ok")
    assert "repeat" not in a and "devices_min" not in a
    assert (b["step"], b["reach"], b["repeats"]) == (5.0, "not reached", 1)
    assert b["status"] == "1 of 2 ok; failed (exit 1)"
    assert row_spread(a, "step") == Spread(2.0, 1.0, 3.0, 3)
    assert row_spread(a, "reach") == Spread(12.0, 10.0, math.inf, 3)
    assert presented([a], ["step", "reach", "devices"]) == [
        {"step": "2.000 [1.000-3.000]", "reach": "12.00 [10.00-not reached]", "devices": 4}
    ]


def test_a_ratio_inside_the_noise_is_reported_as_indistinguishable() -> None:
    # The committed ablation's "0.69x of the unshaped link": unshaped steps varied 0.055-0.14 s.
    check = at_most_times(
        "shaped step <= 1.5x unshaped",
        Spread(0.052, 0.050, 0.055, 3),
        Spread(0.075, 0.055, 0.14, 3),
        1.5,
    )
    assert check.met is True
    assert check.measured.startswith("0.693x [0.357-1.00] (0.0520 s [0.0500-0.0550] vs")
    assert "medians of 3 repeats; the ranges overlap: the two are not distinguishable" in (
        check.measured
    )


class _RunnerWithoutFleet(ExperimentRunner):
    """The real runner's busy policy around a stand-in for one fleet run (no fleet here)."""

    def __init__(self, tmp_path: Path, busy_pattern: list[bool], **options: object) -> None:
        super().__init__(tmp_path, refuse_if_up=(), progress=self.lines.append, **options)  # type: ignore[arg-type]
        self.busy_pattern = list(busy_pattern)
        self.waits = 0

    lines: list[str] = []

    def _run_one(self, scheduled, latency_emulated, sources):  # type: ignore[no-untyped-def]
        spec = scheduled.spec
        run = replace(
            result(spec, summary(epoch_seconds=[1.0], val_accuracies=[0.9]), tmp_dir=self.out_dir),
            load=_load(self.busy_pattern.pop(0)),
            repeat=scheduled.repeat,
        )
        run.run_dir.mkdir(parents=True, exist_ok=True)
        (run.run_dir / "fleet-run.log").write_text("log\n")
        return run

    def _wait_for_quiet(self, sources) -> None:  # type: ignore[no-untyped-def]
        self.waits += 1


@pytest.mark.parametrize(
    ("policy", "pattern", "status", "reruns", "busy"),
    [
        ("mark", [True], "ok", 0, True),
        ("refuse", [True], "refused: machine busy (0.45 cores used outside", 0, True),
        ("rerun", [True, True, False], "ok", 2, False),
        ("rerun", [True, True, True], "ok", 2, True),  # gave up after max_reruns: marked
    ],
)
def test_a_busy_run_is_marked_refused_or_run_again_as_the_policy_says(
    tmp_path: Path, policy: str, pattern: list[bool], status: str, reruns: int, busy: bool
) -> None:
    runner = _RunnerWithoutFleet(tmp_path, pattern, busy_policy=policy, max_reruns=2)
    (scheduled,) = interleave(DevicesExperiment(quick=True).plan()[:1], 1)
    run = runner._run_under_policy(scheduled, False, None)  # type: ignore[arg-type]
    assert run.status.startswith(status) and run.reruns == reruns
    assert run.machine_busy is busy and runner.waits == reruns and not runner.busy_pattern
    kept_logs = sorted(path.name for path in run.run_dir.glob("fleet-run*.log"))
    assert len(kept_logs) == reruns + 1  # every busy attempt's log is kept
    if policy == "refuse":
        assert not run.ok  # out of the medians, and reported as a failed run


def test_a_bad_busy_policy_is_named() -> None:
    with pytest.raises(ValueError, match="busy policy 'maybe' is not one of: mark, refuse, rerun"):
        ExperimentRunner(Path("out"), busy_policy="maybe")


def test_outputs_show_medians_with_ranges_and_the_load_of_every_run(tmp_path: Path) -> None:
    experiment = DevicesExperiment(quick=True)
    results = []
    for repeat, (seconds, busy) in enumerate(((10.0, False), (12.0, True), (11.0, False)), 1):
        for spec in experiment.plan():
            run = summary(epoch_seconds=[seconds, seconds], val_accuracies=[0.91, 0.95])
            results.append(replace(result(spec, run), repeat=repeat, load=_load(busy)))
    report = write_outputs(
        experiment, results, tmp_path, protocol={"repeats": 3, "busy_policy": "mark",
                                                 "busy_limits": BusyLimits().get_config()}
    )  # fmt: skip
    row = next(row for row in report.rows if row["label"] == "lenet-n2-none")
    assert (row["training_seconds"], row["repeats"], row["busy_repeats"]) == (22.0, 3, 1)
    markdown = (tmp_path / "devices.md").read_text()
    assert "| 11.00 [10.00-12.00] |" in markdown  # seconds_per_epoch, median [min-max]
    assert "Each run was repeated 3 times, interleaved" in markdown
    assert "Fewer than 3 repeats" not in markdown
    assert "Taken on a busy machine: lenet-n1-none repeat 2" in markdown
    assert "### Load during each run" in markdown
    runs_csv = (tmp_path / "devices-runs.csv").read_text().splitlines()
    assert len(runs_csv) == 1 + 18 and "outside_cpu_cores" in runs_csv[0]


def test_paths_in_results_are_relative_to_the_repository_whatever_clone_wrote_them() -> None:
    assert portable(
        "globaldl train --summary /work/main/results/experiments/ablation/runs/none/summary.json"
        " --state-dir /run/globaldl-experiments"
    ) == (
        "globaldl train --summary results/experiments/ablation/runs/none/summary.json"
        " --state-dir /run/globaldl-experiments"
    )
    from globaldl.experiments.results import REPOSITORY_ROOT

    assert portable(f"--data-dir {REPOSITORY_ROOT}/runs/data x") == "--data-dir runs/data x"


def test_report_rebuilds_a_fresh_clone_from_the_json_and_makes_its_paths_relative(
    tmp_path: Path,
) -> None:
    """A clone has NAME.json but no runs/ (they stay local); old runs had absolute paths."""
    from globaldl.cli.experiment import app

    experiment = AblationExperiment(quick=True)
    runs = []
    for spec in experiment.plan():
        run = result(spec, summary(epoch_seconds=[5.0, 5.0], val_accuracies=[0.8, 0.92]))
        run.train_command = (
            f"globaldl train --summary /elsewhere/clone/results/experiments/ablation/runs/"
            f"{spec.label}/summary.json"
        )
        runs.append(run.to_dict())
    runs[0]["run_dir"] = "/elsewhere/clone/results/experiments/ablation/runs/none"
    measured_on = {"cpu": "the machine that ran them", "cores": 2}
    (tmp_path / "ablation.json").write_text(
        json.dumps({"runs": runs, "complete": True, "machine": measured_on})
    )
    completed = CliRunner().invoke(app, ["report", "ablation", "--quick", "--out", str(tmp_path)])
    assert completed.exit_code == 0, completed.output
    text = "".join(
        path.read_text() for path in tmp_path.glob("ablation*.*") if path.suffix != ".png"
    )
    assert "/elsewhere/clone" not in text
    assert "--summary results/experiments/ablation/runs/none/summary.json" in text
    document = json.loads((tmp_path / "ablation.json").read_text())
    assert document["machine"] == measured_on
    assert [RunResult.from_dict(run).spec.label for run in document["runs"]] == [
        spec.label for spec in experiment.plan()
    ]


def test_a_resumed_schedule_leaves_out_the_runs_already_recorded() -> None:
    plan = AblationExperiment(quick=True).plan()[:2]
    a, b = plan[0].label, plan[1].label
    schedule = interleave(plan, 3, done={(a, 1), (b, 1), (a, 2)})
    assert [(run.spec.label, run.repeat, run.repeats) for run in schedule] == [
        (b, 2, 3), (a, 3, 3), (b, 3, 3)
    ]  # fmt: skip


def test_resume_keeps_the_runs_recorded_ok_and_runs_the_rest_in_order(tmp_path: Path) -> None:
    """An experiment stopped part-way resumes: failed runs run again, finished ones stay."""
    from globaldl.experiments import run_experiment
    from globaldl.experiments.results import RESULT_FILE, repeat_dir

    experiment = AblationExperiment(quick=True)
    plan = experiment.plan()[:3]
    a, b, c = (spec.label for spec in plan)
    recorded = [
        replace(result(plan[0], summary(epoch_seconds=[10.0], val_accuracies=[0.8])), repeat=1),
        replace(result(plan[1], summary(epoch_seconds=[30.0], val_accuracies=[0.8])), repeat=1),
        replace(result(plan[2], summary(epoch_seconds=[40.0], val_accuracies=[0.8])), repeat=1),
        replace(result(plan[0], None, status="failed (exit 1)"), repeat=2),
    ]
    for run in recorded:
        folder = repeat_dir(tmp_path, run.spec.label, run.repeat)
        folder.mkdir(parents=True)
        (folder / RESULT_FILE).write_text(json.dumps(run.to_dict()))
    (tmp_path / "ablation.json").write_text(json.dumps({"command": "globaldl experiment x"}))

    class Runner:
        busy_policy, max_reruns, busy_limits = "mark", 2, BusyLimits()
        done: set[tuple[str, int]] = set()

        def validate(self, specs: list) -> None:
            pass

        def check_no_fleet_up(self) -> None:
            pass

        def run(self, specs: list, collected: list, *, repeats: int, earlier, done) -> list:
            self.done = set(done)
            for scheduled in interleave(specs, repeats, done):
                fresh = summary(epoch_seconds=[20.0], val_accuracies=[0.9])
                collected.append(replace(result(scheduled.spec, fresh), repeat=scheduled.repeat))
            return collected

    runner = Runner()
    report = run_experiment(
        type(experiment)(quick=True),
        runner,  # type: ignore[arg-type]
        tmp_path,
        "globaldl experiment x --resume",
        only=[a, b],
        repeats=2,
        resume=True,
    )
    # The failed repeat 2 of `a` runs again; `c`, not chosen, is kept and not counted as done.
    assert runner.done == {(a, 1), (b, 1)}
    runs = [(run.spec.label, run.repeat, run.status) for run in report.results]
    assert runs == [(a, 1, "ok"), (b, 1, "ok"), (c, 1, "ok"), (a, 2, "ok"), (b, 2, "ok")]
    seconds = {(run.spec.label, run.repeat): run.summary["history"][0]["seconds"]
               for run in report.results}  # fmt: skip
    assert seconds == {(a, 1): 10.0, (b, 1): 30.0, (c, 1): 40.0, (a, 2): 20.0, (b, 2): 20.0}
    assert json.loads((tmp_path / "ablation.json").read_text())["command"] == (
        "globaldl experiment x; then globaldl experiment x --resume"
    )


def test_a_resumed_run_with_nothing_left_brings_no_fleet_up_and_removes_nothing(
    tmp_path: Path,
) -> None:
    from globaldl.experiments.results import RESULT_FILE, repeat_dir

    (spec,) = AblationExperiment(quick=True).plan()[:1]
    folder = repeat_dir(tmp_path / "out", spec.label, 1)
    folder.mkdir(parents=True)
    (folder / RESULT_FILE).write_text("{}")
    runner = ExperimentRunner(tmp_path / "out", state_dir=tmp_path / "state")
    assert runner.run([spec], repeats=1, done={(spec.label, 1)}) == []
    assert (folder / RESULT_FILE).read_text() == "{}"
    assert not (tmp_path / "state").exists()
