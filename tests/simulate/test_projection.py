"""Projection outputs: tables, plots, crossovers and the README section they regenerate."""

import json
import re

import pytest

from globaldl.compression.lanes import packed_bytes
from globaldl.simulate.fleetdata import load_observations
from globaldl.simulate.outputs import (
    DEFAULT_OUT_DIR,
    DEFAULT_README,
    PARAMETERS_FILE,
    README_BEGIN,
    README_END,
    calibration_summary,
    projection_documents,
    read_parameters,
    readme_section,
    refresh_readme,
    write_projection,
)
from globaldl.simulate.platform import (
    SpeedMix,
    default_profiles,
    parse_mix_shares,
    parse_speed_shares,
)
from globaldl.simulate.projection import (
    ProjectionRequest,
    answer,
    build_fleet,
    crossovers,
    model_profile,
    project,
)


def _row(devices, mode, examples_per_second, times_out=False):
    return {
        "devices": devices,
        "mode": mode,
        "examples_per_second": examples_per_second,
        "step_seconds": devices / examples_per_second,
        "times_out": times_out,
        "longest_wait_seconds": devices / 10,
        "seconds_to_target_same_steps": 124 * devices / examples_per_second,
    }


def test_a_mode_pays_off_while_it_gains_ten_percent_and_does_not_time_out():
    rows = [
        _row(10, "dense", 100.0),
        _row(100, "dense", 150.0),
        _row(1000, "dense", 155.0),
        _row(10, "local", 100.0),
        _row(100, "local", 900.0),
        _row(1000, "local", 5000.0, times_out=True),
    ]
    by_mode = {row["mode"]: row for row in crossovers(rows)}
    assert by_mode["dense"]["pays_off_up_to_devices"] == 100
    assert by_mode["local"]["pays_off_up_to_devices"] == 100
    assert by_mode["local"]["first_timeout_devices"] == 1000
    assert answer(rows)["mode"] == "local"


def test_the_answer_follows_the_best_mode_not_a_slow_one_still_gaining_from_its_own_base():
    # Dense gains 18% from 100 to 1000 devices, but reaches only 73 examples/s; local runs 606
    # at 100 and gains 9.6% at 1000: one run uses 100 devices, with local steps.
    rows = [
        _row(100, "dense", 61.2),
        _row(1000, "dense", 72.6),
        _row(100, "local", 606.5),
        _row(1000, "local", 664.7),
    ]
    pays_off = {row["mode"]: row["pays_off_up_to_devices"] for row in crossovers(rows)}
    assert pays_off == {"dense": 1000, "local": 100}
    assert answer(rows) == {
        "devices": 100,
        "mode": "local",
        "step_seconds": 100 / 606.5,
        "examples_per_second": 606.5,
        "seconds_to_target": 124 * 100 / 606.5,
    }


def _lenet_on_lte(devices, modes):
    """A short LeNet projection on LTE links (12 steps per point)."""
    return ProjectionRequest(
        devices=devices, mix=parse_mix_shares("lte:100"), model="lenet", steps=12, modes=modes
    )


def test_a_small_projection_writes_its_tables_plot_and_readme_section(tmp_path):
    profiles = default_profiles()
    request = _lenet_on_lte((2, 8), ("dense", "gather"))
    parameters_path = DEFAULT_OUT_DIR / PARAMETERS_FILE
    rows = project(request, load_observations(), read_parameters(parameters_path), profiles)
    assert [(row["devices"], row["mode"]) for row in rows] == [
        (2, "dense"),
        (2, "gather"),
        (8, "dense"),
        (8, "gather"),
    ]
    assert all(row["step_seconds"] > 0 and row["device_tx_bytes_per_step"] > 0 for row in rows)
    # A ring of 8 LTE devices moves the dense gradients further than a ring of 2.
    assert rows[2]["step_seconds"] > rows[0]["step_seconds"]
    header = {
        "title": "test",
        "command": "test",
        "parameters_file": PARAMETERS_FILE,
        "calibration": calibration_summary(json.loads(parameters_path.read_text())),
        "simulation_seconds": 1.0,
        "request": {"devices": [2, 8], "mix": "lte:100", "model": "lenet", "cpu_cores": 0.5}
        | {"gloo_timeout_seconds": 30.0},
    }
    write_projection(tmp_path, "lte", rows, header)
    for suffix in (".json", ".csv", ".md", ".png"):
        assert (tmp_path / f"lte{suffix}").stat().st_size > 0
    [document] = projection_documents(tmp_path)
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n\n{README_BEGIN}\nold\n{README_END}\n\nrest\n")
    assert refresh_readme(readme, readme_section([document], "results/projection"))
    text = readme.read_text()
    assert "old" not in text and text.endswith("rest\n")
    found = document["answer"]
    assert f"| lte:100 | {found['devices'] or 'none of the projected counts'} |" in text
    assert "results/projection/lte.md" in text


def test_summed_sparse_payloads_stay_flat_per_device_where_gathered_ones_grow_with_n():
    request = _lenet_on_lte((2, 200), ("gather", "sparse-sum"))
    parameters = read_parameters(DEFAULT_OUT_DIR / PARAMETERS_FILE)
    rows = project(request, load_observations(), parameters, default_profiles())
    row = {(row["devices"], row["mode"]): row for row in rows}
    # The fleet's integer sums ran 8-bit lanes (127 ranks at most): 200 devices need 9-bit
    # lanes, seven to an int64 word, so the payload grows by 8/7 and no more.
    small, large = row[2, "sparse-sum"], row[200, "sparse-sum"]
    assert large["payload_bytes"] == packed_bytes(round(small["payload_bytes"]), 9)

    # A ring allreduce sends 2(N-1)/N of the payload; an allgather N-1 payloads.
    def growth(mode):
        return row[200, mode]["device_tx_bytes_per_step"] / row[2, mode]["device_tx_bytes_per_step"]

    assert growth("sparse-sum") < 3 and growth("gather") > 50


def test_a_mode_the_fleet_cannot_stand_for_is_refused_naming_it():
    parameters = read_parameters(DEFAULT_OUT_DIR / PARAMETERS_FILE)
    observations = load_observations()
    unmeasured = ProjectionRequest(
        devices=(2,), mix=parse_mix_shares("lte:100"), model="resnet-8", modes=("sparse-sum",)
    )
    with pytest.raises(ValueError, match="mode sparse-sum stands for codec shared-topk0.01"):
        project(unmeasured, observations, parameters, default_profiles())
    too_many = ProjectionRequest(
        devices=(40_000,), mix=parse_mix_shares("lte:100"), model="lenet", modes=("sparse-sum",)
    )
    with pytest.raises(ValueError, match="sparse-sum .* cannot run on 40000 devices"):
        project(too_many, observations, parameters, default_profiles())


def test_a_readme_without_markers_is_left_alone(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("# no markers\n")
    assert not refresh_readme(readme, "section")
    assert readme.read_text() == "# no markers\n"


def test_bad_projection_requests_name_the_value():
    with pytest.raises(ValueError, match="devices"):
        ProjectionRequest(devices=(0,), mix=parse_mix_shares("lte:100"), model="lenet")
    with pytest.raises(ValueError, match="lte-x"):
        parse_mix_shares("lte-x")


def test_a_speed_mix_splits_the_devices_by_its_shares_apart_from_their_links():
    speeds = parse_speed_shares("1:70,0.25:30").speeds(10)
    assert sorted(speeds.tolist()) == [0.25] * 3 + [1.0] * 7
    assert speeds.tolist() == parse_speed_shares("1:70,0.25:30").speeds(10).tolist()
    request = ProjectionRequest(
        devices=(1000,),
        mix=parse_mix_shares("lte:50,nb-iot:50"),
        model="lenet",
        speeds=parse_speed_shares("1:50,0.25:50"),
    )
    fleet = build_fleet(request, 1000, default_profiles())
    slow_on = [
        sum(1 for device in fleet.devices if device.profile.name == name and device.speed < 1)
        for name in ("lte", "nb-iot")
    ]
    # Independent assignments put about half of each link's devices at the slow speed; one
    # order for both would put every slow device on one link, or none.
    assert sum(slow_on) == 500 and all(200 < count < 300 for count in slow_on), slow_on
    assert SpeedMix.uniform().is_uniform and not parse_speed_shares("1:99,0.5:1").is_uniform


def test_one_slow_device_in_four_holds_every_synchronous_step_back_unless_batches_follow_speed():
    parameters = read_parameters(DEFAULT_OUT_DIR / PARAMETERS_FILE)
    observations, profiles = load_observations(), default_profiles()

    def step_seconds(speeds, balance="equal"):
        request = ProjectionRequest(
            devices=(4,),
            mix=parse_mix_shares("fibre:100"),
            model="resnet-8",
            steps=12,
            modes=("dense",),
            speeds=parse_speed_shares(speeds),
            balance=balance,
        )
        [row] = project(request, observations, parameters, profiles)
        return row["step_seconds"]

    alike, one_slow = step_seconds("1:100"), step_seconds("1:75,0.25:25")
    all_slow = step_seconds("0.25:100")
    # ResNet-8 on fibre is compute-bound: the step waits for the slowest device's compute, so
    # one slow device of four costs most of what four slow ones cost (their exchange's CPU is
    # slow too, which the one slow device's peers do not pay)...
    assert 1.5 * alike < one_slow <= all_slow
    # ...unless, as training's --balance speed does, the slow device gets a smaller batch.
    balanced = step_seconds("1:75,0.25:25", "speed")
    assert alike <= balanced < 0.75 * one_slow
    assert step_seconds("1:100", "speed") == pytest.approx(alike, rel=1e-9)
    with pytest.raises(ValueError, match="balance must be one of"):
        ProjectionRequest(devices=(4,), mix=parse_mix_shares("lte:100"), model="x", balance="fair")


def test_steps_to_the_target_come_from_runs_that_exchanged_as_the_mode_does():
    observations = load_observations()
    every_step = model_profile(observations, "lenet", "none", 0.9)
    local = model_profile(observations, "lenet", "none", 0.9, local_steps=16, overlap=True)
    unmeasured = model_profile(observations, "lenet", "none", 0.9, local_steps=8, overlap=True)
    # Dense LeNet every step, and with 16 overlapped local steps, both reached 90% on the fleet;
    # each projected mode takes its own runs' steps, never the other's.
    assert "-h" not in every_step.steps_source and every_step.steps_to_target
    assert "h16-none-overlap" in local.steps_source and local.steps_to_target
    assert unmeasured.steps_to_target is None
    assert unmeasured.steps_source == (
        "no fleet run exchanging every 8 steps, overlapped reached the target"
    )
    # Payload and CPU a step do not depend on how often the runs exchanged.
    assert local.payload_bytes == every_step.payload_bytes == unmeasured.payload_bytes


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("fast:70", "fast:70"),
        ("1", "'1'"),
        ("0:100", "got 0.0"),
        ("-1:100", "got -1.0"),
        ("1:0", "share of speed 1 must be > 0"),
        ("1:50,1:50", "speed 1 twice"),
        ("inf:10", "got inf"),
    ],
)
def test_bad_speeds_are_refused_naming_the_entry(text, named):
    with pytest.raises(ValueError, match=re.escape(named)):
        parse_speed_shares(text)


def test_the_committed_projections_and_readme_state_the_committed_calibration():
    # A calibration that moves its error leaves the projections made before it stale; they
    # must be regenerated with it (`globaldl simulate project ...`, then `simulate readme`).
    calibration = json.loads((DEFAULT_OUT_DIR / PARAMETERS_FILE).read_text())
    documents = projection_documents(DEFAULT_OUT_DIR)
    assert documents, f"no committed projection in {DEFAULT_OUT_DIR}"
    for document in documents:
        assert document["calibration"] == calibration_summary(calibration), document["file"]
    readme = DEFAULT_README.read_text()
    relative = DEFAULT_OUT_DIR.relative_to(DEFAULT_README.parent).as_posix()
    assert readme_section(documents, relative) in readme
