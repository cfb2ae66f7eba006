"""Each experiment's run plan, full and quick: the fleets, the exact train arguments, the bounds."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import yaml

import globaldl.experiments as experiments
from globaldl.experiments import (
    AblationExperiment,
    BottleneckExperiment,
    DevicesExperiment,
    FleetConfig,
    ResourcesExperiment,
    RunSpec,
)
from globaldl.experiments.ablation import ALL_VARIANTS, variants_by_label
from globaldl.experiments.spec import (
    COMPRESSION_PRESETS,
    LENET_MNIST,
    TRAIN_LEARNING_RATE,
    Workload,
    compression_args,
    slug,
)
from globaldl.fleet.cycle_time import HOROVOD_DEFAULT_CYCLE_TIME_MS
from globaldl.fleet.profiles import device_profiles, load_profiles
from globaldl.settings import resolve_settings

RECOMMENDED = ("--prune", "topk", "--density", "0.01", "--quantize", "int8")
ALL_PLANS = [
    pytest.param(name, quick, id=f"{name}-{'quick' if quick else 'full'}")
    for name in experiments.EXPERIMENTS
    for quick in (False, True)
]


def _settings(spec: RunSpec, tmp_path: Path):
    """The TrainSettings `globaldl train` would build from the run's arguments."""
    args, config = list(spec.train_args), {}
    while args:
        name = args.pop(0).removeprefix("--")
        if args and not args[0].startswith("--"):
            config[name] = args.pop(0)
        elif name.startswith("no-"):  # the off side of a switch such as --no-scale-lr
            config[name.removeprefix("no-")] = False
        else:  # a switch such as --overlap
            config[name] = True
    if spec.fleet.sites is not None:  # `fleet run` passes the fleet's site map
        site_map = tmp_path / "sites.yaml"
        site_map.write_text("sites:\n  site-1: [10.0.0.2]\n")
        config["sites-file"] = str(site_map)
    path = tmp_path / f"{spec.label}.yaml"
    path.write_text(yaml.safe_dump(config))
    return resolve_settings({}, path, environ={})


@pytest.mark.parametrize(("name", "quick"), ALL_PLANS)
def test_every_planned_run_is_a_valid_train_command_on_a_known_link(
    name: str, quick: bool, tmp_path: Path
) -> None:
    plan = experiments.get(name, quick=quick).plan()
    profiles = load_profiles()
    assert plan
    assert len({spec.label for spec in plan}) == len(plan)
    for spec in plan:
        assert spec.experiment == name
        settings = _settings(spec, tmp_path)
        assert settings.epochs >= 1 and settings.seed == 0
        device_profiles(profiles, devices=spec.fleet.devices, profile=spec.fleet.profile)
        # Fleets must fit the 2-core reference machine without --force.
        assert spec.fleet.cpu_cores_total <= 2.0 + 1e-9


@pytest.mark.parametrize(("name", "quick"), ALL_PLANS)
def test_runs_that_share_a_fleet_are_adjacent(name: str, quick: bool) -> None:
    plan = experiments.get(name, quick=quick).plan()
    blocks = [fleet for fleet, _ in itertools.groupby(plan, key=lambda spec: spec.fleet)]
    assert len(blocks) == len(set(blocks)), "a fleet config would be brought up twice"


@pytest.mark.parametrize("name", list(experiments.EXPERIMENTS))
def test_quick_plans_are_smaller_than_full_ones(name: str) -> None:
    full = experiments.get(name).plan()
    quick = experiments.get(name, quick=True).plan()
    assert len(quick) < len(full)
    quick_steps = sum(_bounded_steps(spec) for spec in quick)
    full_steps = sum(_bounded_steps(spec) for spec in full)
    assert quick_steps < full_steps


def _bounded_steps(spec: RunSpec) -> int:
    epochs = int(spec.option("--epochs") or 1)
    steps = spec.option("--max-steps-per-epoch")
    return epochs * (int(steps) if steps else 250)


def test_devices_full_plan_spans_1_to_8_devices_lenet_both_ways_resnet_compressed() -> None:
    plan = DevicesExperiment().plan()
    assert {spec.fleet.devices for spec in plan} == {1, 2, 4, 8}
    by_model = {
        model: {s.factors["compression"] for s in plan if s.factors["model"] == model}
        for model in ("lenet", "resnet-8")
    }
    # Dense ResNet-8 is left out to fit 3 repeats in ~2 hours (see devices.py).
    assert by_model == {"lenet": {"none", "prune+quantize"}, "resnet-8": {"prune+quantize"}}
    assert len(plan) == 4 * 3
    # Every fleet size runs the compressed workloads, 1 device included (the paper's table).
    assert {s.fleet.devices for s in plan if s.factors["compression"] == "prune+quantize"} == {
        1, 2, 4, 8,
    }  # fmt: skip
    # Fixed CPU per device: adding a device adds compute.
    assert {spec.fleet.cpu_cores_per_device for spec in plan} == {0.25}
    # lte's rates without its delay (what delay adds is the latency experiment's).
    assert {spec.fleet.profile for spec in plan} == {"custom:5:17.5"}
    for spec in plan:
        tail = spec.train_args[-8:-2]
        if spec.factors["compression"] == "prune+quantize":
            assert tail == RECOMMENDED
        else:
            assert not set(RECOMMENDED[::2]) & set(spec.train_args)
        if spec.factors["model"] == "resnet-8":
            assert spec.train_args[:6] == (
                "--model",
                "resnet",
                "--depth",
                "8",
                "--dataset",
                "cifar-synthetic",
            )


@pytest.mark.parametrize("quick", [False, True])
def test_devices_plan_keeps_the_global_work_per_epoch_fixed(quick: bool) -> None:
    plan = DevicesExperiment(quick=quick).plan()
    for (model, compression), runs in itertools.groupby(
        sorted(plan, key=lambda s: (s.factors["model"], s.factors["compression"])),
        key=lambda s: (s.factors["model"], s.factors["compression"]),
    ):
        runs = list(runs)
        assert {s.option("--batch-size") for s in runs} == {"16"}, "local batch must be fixed"
        assert len({s.option("--epochs") for s in runs}) == 1
        capped = [s for s in runs if s.option("--max-steps-per-epoch")]
        # Either every N trains on its 1/N shard of all the data (no cap), or the cap is
        # the same number of global steps split over N.
        assert len(capped) in (0, len(runs))
        if capped:
            global_steps = {int(s.option("--max-steps-per-epoch")) * s.fleet.devices for s in runs}
            assert len(global_steps) == 1, (model, compression, global_steps)


def test_devices_quick_plan_is_1_2_4_devices_of_lenet() -> None:
    plan = DevicesExperiment(quick=True).plan()
    assert sorted({spec.fleet.devices for spec in plan}) == [1, 2, 4]
    assert {spec.factors["model"] for spec in plan} == {"lenet"}
    assert {int(s.option("--max-steps-per-epoch")) * s.fleet.devices for s in plan} == {48}


def test_resources_plan_scrapes_every_mlp_run_across_layers_and_batch_sizes() -> None:
    full = ResourcesExperiment().plan()
    assert {(s.option("--layers"), s.option("--batch-size")) for s in full} == {
        (layers, batch) for layers in ("1", "3", "5") for batch in ("16", "64")
    }
    assert all(s.scrape_metrics and s.option("--model") == "mlp" for s in full)
    quick = ResourcesExperiment(quick=True).plan()
    assert {s.option("--layers") for s in quick} < {"1", "3", "5"}
    assert all(s.option("--max-steps-per-epoch") for s in quick)


def test_ablation_full_plan_has_every_compression_step_on_a_5_mbit_uplink() -> None:
    assert [v.name for v in AblationExperiment().variants] == [
        "none", "fp16", "prune", "quantize", "prune+quantize", "prune+quantize (cycle 1 ms)",
        "prune+quantize (unshaped)", "none (unshaped)",
    ]  # fmt: skip
    assert len(ALL_VARIANTS) == 11  # the dropped ones stay available through `variants`
    experiment = AblationExperiment()
    plan = experiment.plan()
    shaped = [s for s in plan if s.fleet.profile == "custom:5:20"]
    unshaped = [s for s in plan if s.fleet.profile == "custom:10000:10000"]
    assert len(shaped) + len(unshaped) == len(plan)
    assert all(s.fleet.devices == 4 for s in plan)
    args_by_variant = {s.factors["variant"]: s.train_args for s in shaped}
    for preset in ("none", "fp16", "prune", "quantize", "prune+quantize"):
        args = args_by_variant[preset]
        assert args[-2 - len(compression_args(preset)) : -2] == compression_args(preset)
    assert args_by_variant["prune"][-6:-2] == ("--prune", "topk", "--density", "0.01")
    assert args_by_variant["quantize"][-4:-2] == ("--quantize", "int8")
    assert args_by_variant["fp16"][-4:-2] == ("--quantize", "fp16")
    # The unshaped comparison differs from the shaped run in the link only.
    recommended = next(s for s in shaped if s.factors["variant"] == "prune+quantize")
    unshaped_recommended = next(s for s in unshaped if s.factors["compression"] == "prune+quantize")
    assert unshaped_recommended.train_args == recommended.train_args
    assert unshaped_recommended.cycle_time_ms == recommended.cycle_time_ms == 5.0
    # The cycle-time comparison: the same run at Horovod's default.
    default_cycle = [s for s in plan if s.cycle_time_ms == HOROVOD_DEFAULT_CYCLE_TIME_MS]
    assert [s.factors["variant"] for s in default_cycle] == ["prune+quantize (cycle 1 ms)"]
    assert default_cycle[0].train_args == recommended.train_args


def test_ablation_variants_are_chosen_by_label_and_unknown_ones_are_named() -> None:
    chosen = variants_by_label(["none", "none-cycle1ms", "prune0.001_sign"])
    plan = AblationExperiment(variants=chosen).plan()
    assert [s.label for s in plan] == ["none", "none-cycle1ms", "prune0.001_sign"]
    assert plan[1].cycle_time_ms == HOROVOD_DEFAULT_CYCLE_TIME_MS
    with pytest.raises(ValueError, match="variant.* nope unknown; choose from: none, fp16"):
        variants_by_label(["nope"])


def test_ablation_cycle_time_override_reaches_every_run_but_the_horovod_default_one() -> None:
    plan = AblationExperiment(quick=True, cycle_time_ms=50).plan()
    assert sorted({s.cycle_time_ms for s in plan}) == [HOROVOD_DEFAULT_CYCLE_TIME_MS, 50.0]


def test_bottleneck_plan_covers_the_profiles_and_bounds_nb_iot() -> None:
    full = BottleneckExperiment().plan()
    assert [p for p, _ in itertools.groupby(s.fleet.profile for s in full)] == [
        "fibre",
        "lte",
        "slow-4g",
        "lte-m",
        "geo-satellite",
        "nb-iot",
    ]
    assert {s.factors["model"] for s in full} == {"lenet", "resnet-8"}
    nb_iot = [s for s in full if s.fleet.profile == "nb-iot"]
    assert nb_iot and all(int(s.option("--max-steps-per-epoch")) <= 3 for s in nb_iot)
    assert all(s.timeout_seconds > 3600 for s in nb_iot)
    quick = BottleneckExperiment(quick=True).plan()
    assert "nb-iot" not in {s.fleet.profile for s in quick}
    assert {s.factors["model"] for s in quick} == {"lenet", "resnet-8"}


def test_compression_presets_are_valid_settings_and_bad_names_are_refused(tmp_path: Path) -> None:
    for preset in COMPRESSION_PRESETS:
        spec = RunSpec("x", slug(preset), FleetConfig(1, "lte", 0.5), compression_args(preset))
        _settings(spec, tmp_path)
    with pytest.raises(ValueError, match="'zip' is not one of: none, fp16"):
        compression_args("zip")
    with pytest.raises(ValueError, match="compression preset 'zip'"):
        DevicesExperiment(compressions=["zip"])


def test_linear_scaling_stops_at_the_workloads_cap_and_an_uncapped_workload_always_scales() -> None:
    assert resolve_settings({}, environ={}).learning_rate == TRAIN_LEARNING_RATE
    assert LENET_MNIST.learning_rate_args(8) == ()  # 0.08: within the cap
    assert LENET_MNIST.learning_rate_args(9) == ("--no-scale-lr", "--learning-rate", "0.08")
    uncapped = Workload("m", (), 0.5)
    assert uncapped.learning_rate_args(1000) == ()
    assert "at most" not in uncapped.learning_rate_text()
    assert LENET_MNIST.with_target(0.95).max_learning_rate == 0.08
    with pytest.raises(ValueError, match="max_learning_rate must be a positive number"):
        Workload("m", (), 0.5, max_learning_rate=0.0)
    with pytest.raises(ValueError, match="devices must be >= 1, got 0"):
        LENET_MNIST.learning_rate_args(0)


def test_get_accepts_a_name_or_an_instance_and_names_the_experiments_otherwise() -> None:
    instance = DevicesExperiment(quick=True)
    assert experiments.get(instance) is instance
    assert isinstance(experiments.get("ablation", quick=True), AblationExperiment)
    with pytest.raises(ValueError, match="'speed' is not one of: devices, resources"):
        experiments.get("speed")


def test_run_spec_refuses_what_the_runner_owns_and_unsafe_labels() -> None:
    fleet = FleetConfig(2, "lte", 0.5)
    with pytest.raises(ValueError, match="--summary"):
        RunSpec("x", "a", fleet, ("--summary", "s.json"))
    with pytest.raises(ValueError, match="'a b'.*'a_b'"):
        RunSpec("x", "a b", fleet, ())
    with pytest.raises(ValueError, match="devices"):
        FleetConfig(0, "lte", 0.5)
    assert FleetConfig(**fleet.get_config()) == fleet
