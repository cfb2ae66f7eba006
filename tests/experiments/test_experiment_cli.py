"""`globaldl experiment`: dry-run plans, bad options, and the refusal to run beside a fleet."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from globaldl.cli.experiment import app, parse_cycle_time, parse_int_list
from globaldl.fleet.state import FleetState

runner = CliRunner()


def _fake_fleet_state(state_dir: Path) -> None:
    """A recorded fleet (as `fleet up` leaves it) without creating anything on the system."""
    state_dir.mkdir(parents=True)
    FleetState(
        prefix="gdlq",
        subnet="10.79.0.0/24",
        bridge="gdlq-br",
        host_address="10.79.0.1",
        state_dir=str(state_dir),
        identity_file=str(state_dir / "ssh" / "id_ed25519"),
        emulator="vde2 wirefilter",
        emulator_available=True,
        latency_emulated=False,
        phase="up",
    ).save()


@pytest.mark.parametrize(
    ("command", "runs", "fleets"),
    [("devices", 6, 3), ("resources", 4, 1), ("ablation", 5, 2), ("bottleneck", 4, 2)],
)
def test_dry_run_prints_the_quick_plan_without_touching_the_system(
    command: str, runs: int, fleets: int, tmp_path: Path
) -> None:
    result = runner.invoke(
        app,
        [
            command,
            "--quick",
            "--dry-run",
            "--state-dir",
            str(tmp_path / "state"),
            "--out",
            str(tmp_path / "out"),
        ],
    )
    assert result.exit_code == 0, result.output
    assert f"{command}: {runs} runs" in result.output
    assert result.output.count("globaldl fleet up") == fleets
    assert (
        len(re.findall(r"\[\d+\] \S+: HOROVOD_CYCLE_TIME=\d+ globaldl train ", result.output))
        == runs
    )
    assert not (tmp_path / "out").exists() and not (tmp_path / "state").exists()


def test_dry_run_passes_the_options_into_the_plan(tmp_path: Path) -> None:
    result = runner.invoke(
        app,
        [
            "devices",
            "--dry-run",
            "--device-counts",
            "2,8",
            "--cpu",
            "0.2",
            "--profile",
            "slow-4g",
            "--cycle-time-ms",
            "15",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "globaldl fleet up -n 8 --profile slow-4g --cpu 0.2" in result.output
    assert "-n 1 " not in result.output
    assert set(re.findall(r"HOROVOD_CYCLE_TIME=(\S+)", result.output)) == {"15"}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["ablation", "--dry-run", "--cycle-time-ms", "soon"], "--cycle-time-ms 'soon'"),
        (["devices", "--dry-run", "--device-counts", "1,x"], "--device-counts '1,x'"),
        (["bottleneck", "--dry-run", "--profiles", "moon"], "unknown profile 'moon'"),
        (["devices", "--dry-run", "--cpu", "1.0"], "more than this machine"),
    ],
)
def test_bad_options_stop_with_one_line_and_exit_2(args: list[str], message: str) -> None:
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert message in result.output


def test_refuses_to_start_while_a_fleet_is_up_in_its_state_dir(tmp_path: Path) -> None:
    state_dir = tmp_path / "experiments-state"
    _fake_fleet_state(state_dir)
    result = runner.invoke(
        app, ["ablation", "--quick", "--state-dir", str(state_dir), "--out", str(tmp_path / "out")]
    )
    assert result.exit_code == 2, result.output
    assert f"a fleet is already up in the experiments' state dir {state_dir}" in result.output
    assert f"globaldl fleet down --state-dir {state_dir}" in result.output
    assert not (tmp_path / "out").exists()


def test_parsers_accept_auto_and_lists_and_name_bad_values() -> None:
    assert parse_cycle_time("auto") is None
    assert parse_cycle_time("20") == 20.0
    with pytest.raises(ValueError, match="use auto or milliseconds > 0"):
        parse_cycle_time("0")
    assert parse_int_list("--device-counts", "1, 2,4") == [1, 2, 4]
    with pytest.raises(ValueError, match=">= 1"):
        parse_int_list("--device-counts", "0,2")


def test_all_dry_run_prints_every_plan() -> None:
    result = runner.invoke(app, ["all", "--quick", "--dry-run"])
    assert result.exit_code == 0, result.output
    assert re.findall(r"^(\w+): (\d+) runs$", result.output, flags=re.MULTILINE) == [
        ("devices", "6"),
        ("resources", "4"),
        ("ablation", "5"),
        ("bottleneck", "4"),
        ("recovery", "2"),
        ("chaos", "2"),
        ("balance", "2"),
        ("rounds", "4"),
        ("latency", "4"),
        ("scale", "3"),
        ("sites", "1"),
        ("scaling", "8"),
        ("learning", "2"),
    ]


def test_shared_protocol_options_reach_every_command_and_bad_ones_are_named(tmp_path: Path) -> None:
    out = ["--out", str(tmp_path / "out"), "--state-dir", str(tmp_path / "state")]
    repeated = runner.invoke(app, ["balance", "--quick", "--dry-run", "--repeats", "5", *out])
    assert repeated.exit_code == 0, repeated.output
    assert "x 5 repeats, interleaved = 10 runs" in repeated.output
    full = runner.invoke(app, ["recovery", "--dry-run", "--kill-runs", "1", *out])
    assert "x 3 repeats, interleaved = 6 runs" in full.output  # 3 for full runs
    bad = runner.invoke(app, ["ablation", "--quick", "--dry-run", "--busy", "maybe", *out])
    assert bad.exit_code == 2
    assert "busy policy 'maybe' is not one of: mark, refuse, rerun" in bad.output
    unknown = runner.invoke(app, ["ablation", "--dry-run", "--variants", "none,nope", *out])
    assert unknown.exit_code == 2 and "variant(s) nope unknown" in unknown.output


def test_a_resumed_dry_run_plans_only_the_runs_not_recorded(tmp_path: Path) -> None:
    import json

    from experiment_fakes import result, summary

    from globaldl.experiments import BottleneckExperiment
    from globaldl.experiments.results import RESULT_FILE, repeat_dir

    first = BottleneckExperiment(quick=True).plan()[0]
    folder = repeat_dir(tmp_path / "out", first.label, 1)
    folder.mkdir(parents=True)
    recorded = result(first, summary(epoch_seconds=[10.0], val_accuracies=[0.5]))
    (folder / RESULT_FILE).write_text(json.dumps(recorded.to_dict()))
    options = ["bottleneck", "--quick", "--dry-run", "--out", str(tmp_path / "out")]
    fresh = runner.invoke(app, [*options, "--repeats", "2"])
    resumed = runner.invoke(app, [*options, "--repeats", "2", "--resume"])
    assert fresh.exit_code == 0 and resumed.exit_code == 0, fresh.output + resumed.output
    assert "x 2 repeats, interleaved = 8 runs;" in fresh.output
    assert "x 2 repeats, interleaved = 7 runs, 1 recorded already;" in resumed.output
