"""The recovery and balance experiments: plans, recovery times from faults, rows and targets."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
from experiment_fakes import result, summary

from globaldl.experiments import BalanceExperiment, RecoveryExperiment
from globaldl.experiments.load import BusyLimits
from globaldl.experiments.recovery import COMMIT_EVERY, recovery_seconds
from globaldl.experiments.runner import FaultInjector
from globaldl.experiments.spec import Fault, FleetConfig, RunSpec


def test_recovery_plan_runs_elastic_with_a_kill_and_a_revive_on_device_3() -> None:
    specs = RecoveryExperiment().plan()
    assert [spec.label for spec in specs] == ["uninterrupted", "kill-revive-1", "kill-revive-2"]
    for spec in specs:
        assert spec.fleet.devices == 3
        assert spec.fleet_run_args[:3] == ("--elastic", "--min-np", "2")
        assert spec.env["HOROVOD_GLOO_TIMEOUT_SECONDS"] == "45"
    assert specs[0].faults == ()
    assert [(f.action, f.device) for f in specs[1].faults] == [("kill", 3), ("revive", 3)]
    again = RunSpec.from_config(specs[1].get_config())
    assert again == specs[1]


def test_recovery_seconds_come_from_fault_times_and_the_summarys_events() -> None:
    spec = RecoveryExperiment().plan()[1]
    run_summary = summary(epoch_seconds=[5.0] * 6, val_accuracies=[0.9] * 6, ranks=3)
    run_summary["elastic"] = {
        "sizes": [3, 2, 3],
        "lost_steps": 4,
        "events": [
            {"reason": "failure", "detected_at": 111.0, "first_step_at": 113.5},
            {"reason": "hosts_changed", "detected_at": 150.0, "first_step_at": 162.0},
        ],
    }
    run = result(spec, run_summary)
    run.faults = [
        {"action": "kill", "device": "gdlx-3", "at": 100.0, "done_at": 100.2},
        {"action": "revive", "device": "gdlx-3", "at": 140.0, "done_at": 145.0},
    ]
    assert recovery_seconds(run) == {"detect": 11.0, "kill": 13.5, "revive": 17.0}
    experiment = RecoveryExperiment()
    reference = result(
        experiment.plan()[0],
        summary(epoch_seconds=[5.0] * 6, val_accuracies=[0.905] * 6, ranks=3),
    )
    rows = experiment.rows([reference, run])
    assert rows[1]["sizes"] == "3->2->3" and rows[1]["lost_steps"] == 4
    checks = experiment.targets(rows, [reference, run])
    assert [check.met for check in checks] == [True, True]
    rows[1]["lost_steps"] = COMMIT_EVERY + 1
    assert experiment.targets(rows, [reference, run])[0].met is False


def test_balance_plan_is_a_mixed_cpu_fleet_with_equal_and_speed_runs() -> None:
    specs = BalanceExperiment().plan()
    assert {spec.fleet.cpu_cores_each for spec in specs} == {(0.8, 0.8, 0.2, 0.2)}
    assert [spec.factors["balance"] for spec in specs] == ["equal", "speed"] * 2
    assert "--cpu-each 0.8,0.8,0.2,0.2" in specs[0].fleet.up_command(
        prefix="p", subnet="10.9.0.0/24", state_dir="/s"
    )
    assert specs[0].fleet.cpu_cores_total == pytest.approx(2.0)


def test_balance_targets_compare_step_time_and_time_to_accuracy() -> None:
    experiment = BalanceExperiment(quick=True)
    equal_spec, speed_spec = experiment.plan()
    equal = summary(epoch_seconds=[20.0, 20.0], val_accuracies=[0.85, 0.93], ranks=4)
    speed = summary(epoch_seconds=[10.0, 10.0], val_accuracies=[0.86, 0.93], ranks=4)
    speed["rank_batch_sizes"] = [26, 26, 6, 6]
    results = [result(equal_spec, equal), result(speed_spec, speed)]
    rows = experiment.rows(results)
    assert rows[1]["rank_batch_sizes"] == "26/26/6/6"
    assert rows[0]["seconds_to_target"] == 40.0 and rows[1]["seconds_to_target"] == 20.0
    assert [check.met for check in experiment.targets(rows, results)] == [True, True]


def test_fault_injector_fires_in_order_after_the_output_lines(tmp_path: Path) -> None:
    """The fleet here is a recorder: `fleet kill` itself is tested on real namespaces."""

    class Recorder:
        def __init__(self) -> None:
            self.calls: list[tuple[str, str]] = []

        def kill(self, name: str) -> None:
            self.calls.append(("kill", name))

        def revive(self, name: str) -> None:
            self.calls.append(("revive", name))

    log = tmp_path / "run.log"
    log.write_bytes(b"")
    writer = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"""
import time
with open({str(log)!r}, "ab", buffering=0) as out:
    for line in (b"starting\\n", b"[0]<stdout>:epoch 1/6 ok\\n", b"[0]<stdout>:epoch 3/6\\n"):
        time.sleep(0.5)
        out.write(line)
    time.sleep(3)
""",
        ]
    )
    fleet = Recorder()
    injector = FaultInjector(
        [Fault("kill", 2, r"epoch 1/"), Fault("revive", 2, r"epoch 3/", delay_seconds=0.2)],
        log,
        fleet,  # type: ignore[arg-type]
        "gdlx",
        writer,
    )
    started = time.time()
    injector.start()
    writer.wait(timeout=30)
    done = injector.stop()
    assert fleet.calls == [("kill", "gdlx-2"), ("revive", "gdlx-2")]
    assert started < done[0]["at"] < done[1]["at"]
    assert done[1]["at"] - done[0]["at"] >= 0.6  # the second line came 0.5 s later, +0.2 s


def test_faults_must_name_a_device_of_the_fleet() -> None:
    with pytest.raises(ValueError, match="fault on device 4, but the fleet has 3 devices"):
        RunSpec(
            "recovery",
            "x",
            FleetConfig(3, "lte", 0.5),
            ("--epochs", "1"),
            faults=(Fault("kill", 4, "epoch"),),
        )
    with pytest.raises(
        ValueError, match="fault action .reboot. is not one of: kill, revive, measure"
    ):
        Fault("reboot", 1, "epoch")


def test_only_reruns_the_named_runs_and_keeps_the_others_from_the_folder(tmp_path: Path) -> None:
    """A recording stand-in for the fleet runner (the real one is tested on a real fleet)."""
    from globaldl.experiments import run_experiment

    experiment = BalanceExperiment(quick=True)
    equal_spec, speed_spec = experiment.plan()
    old_equal = result(
        equal_spec, summary(epoch_seconds=[20.0, 20.0], val_accuracies=[0.85, 0.93], ranks=4)
    )
    (tmp_path / "runs" / "lenet-equal").mkdir(parents=True)
    (tmp_path / "runs" / "lenet-equal" / "result.json").write_text(json.dumps(old_equal.to_dict()))

    class Runner:
        ran: list[str] = []
        busy_policy, max_reruns, busy_limits = "mark", 2, BusyLimits()

        def validate(self, specs: list[RunSpec]) -> None:
            pass

        def check_no_fleet_up(self) -> None:
            pass

        def run(
            self, specs: list[RunSpec], collected: list, *, repeats: int, earlier, done
        ) -> list:
            assert not done  # without --resume every repeat of the chosen runs runs
            self.ran = [spec.label for spec in specs]
            assert [r.spec.label for r in earlier] == ["lenet-equal"]  # seeds the time estimate
            for repeat, seconds in zip(range(1, repeats + 1), (10.0, 12.0), strict=False):
                fresh = summary(
                    epoch_seconds=[seconds, seconds], val_accuracies=[0.86, 0.93], ranks=4
                )
                collected.extend(replace(result(spec, fresh), repeat=repeat) for spec in specs)
            return collected

    runner = Runner()
    (tmp_path / "balance.json").write_text(json.dumps({"command": "globaldl experiment balance"}))
    report = run_experiment(
        experiment,
        runner,  # type: ignore[arg-type]
        tmp_path,
        "globaldl experiment balance --only lenet-speed",
        only=["lenet-speed"],
        repeats=2,
    )
    assert runner.ran == ["lenet-speed"]
    # The kept run's command stays on record beside the one that re-ran lenet-speed.
    assert json.loads((tmp_path / "balance.json").read_text())["command"] == (
        "globaldl experiment balance; then globaldl experiment balance --only lenet-speed"
    )
    assert [row["label"] for row in report.rows] == ["lenet-equal", "lenet-speed"]
    # The kept run was written before repeats existed (runs/LABEL/result.json): repeat 1.
    assert (report.rows[0]["training_seconds"], report.rows[0]["repeats"]) == (40.0, 1)
    speed = report.rows[1]
    assert (speed["training_seconds"], speed["repeats"]) == (22.0, 2)
    assert (speed["training_seconds_min"], speed["training_seconds_max"]) == (20.0, 24.0)
    with pytest.raises(ValueError, match="no run labelled nope in balance; its runs: lenet-equal"):
        run_experiment(experiment, runner, tmp_path, only=["nope"])  # type: ignore[arg-type]


def test_committed_runs_stay_beside_the_runs_recorded_in_the_folder(tmp_path: Path) -> None:
    """A fresh clone has only NAME.json; a run added there with `--only` keeps the others."""
    from globaldl.experiments.results import load_results

    experiment = BalanceExperiment(quick=True)
    equal_spec, speed_spec = experiment.plan()
    committed = [
        result(spec, summary(epoch_seconds=[20.0, 20.0], val_accuracies=[0.85, 0.90], ranks=4))
        for spec in (equal_spec, speed_spec)
    ]
    (tmp_path / "balance.json").write_text(
        json.dumps({"runs": [run.to_dict() for run in committed]})
    )
    fresh = result(
        speed_spec, summary(epoch_seconds=[10.0, 10.0], val_accuracies=[0.86, 0.95], ranks=4)
    )
    (tmp_path / "runs" / "lenet-speed" / "repeat-1").mkdir(parents=True)
    (tmp_path / "runs" / "lenet-speed" / "repeat-1" / "result.json").write_text(
        json.dumps(fresh.to_dict())
    )
    loaded = load_results(tmp_path, experiment.plan(), name="balance")
    assert [(run.spec.label, run.repeat) for run in loaded] == [
        ("lenet-equal", 1),
        ("lenet-speed", 1),
    ]
    # The same label and repeat in both: the folder's run (the newer) wins.
    assert [run.summary["val_accuracy"] for run in loaded] == [0.90, 0.95]  # type: ignore[index]
