from __future__ import annotations

from pathlib import Path

import pytest

from globaldl import settings as settings_module
from globaldl.compression import CompressionConfig
from globaldl.settings import SettingsError, TrainSettings, resolve_settings


def test_defaults_are_the_embedded_demo() -> None:
    settings = resolve_settings({}, None, environ={})
    compression = settings.compression
    assert (settings.model, settings.dataset, compression.prune, compression.quantize) == (
        "lenet",
        "mnist",
        "none",
        "none",
    )


def test_flag_beats_file_beats_environment(tmp_path: Path) -> None:
    config = tmp_path / "run.yaml"
    config.write_text("epochs: 5\nbatch-size: 16\nlearning_rate: 0.2\n")
    environ = {
        "GLOBALDL_EPOCHS": "7",
        "GLOBALDL_BATCH_SIZE": "8",
        "GLOBALDL_SEED": "3",
        "GLOBALDL_LEARNING_RATE": "0.3",
    }
    settings = resolve_settings({"epochs": 9, "batch_size": None}, config, environ=environ)
    assert settings.epochs == 9  # flag over file and environment
    assert settings.batch_size == 16  # file over environment (flag not given)
    assert settings.learning_rate == 0.2  # file over environment
    assert settings.seed == 3  # environment over default


def test_environment_booleans_and_paths_are_coerced(tmp_path: Path) -> None:
    settings = resolve_settings(
        {},
        None,
        environ={"GLOBALDL_ERROR_FEEDBACK": "no", "GLOBALDL_SUMMARY": str(tmp_path / "s.json")},
    )
    assert settings.compression.error_feedback is False
    assert settings.summary == tmp_path / "s.json"


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"model": "vgg"}, "model 'vgg' is not one of: lenet, resnet, mlp, video"),
        ({"dataset": "imagenet"}, "dataset 'imagenet' is not one of: mnist, digits"),
        ({"model": "resnet", "depth": 18}, "depth 18 is not one of: 8, 14, 20, 32"),
        ({"batch_size": 0}, "batch_size 0 is not allowed"),
        ({"learning_rate": -1.0}, "learning_rate -1.0 is not allowed"),
        ({"metrics_port": 70000}, "metrics_port 70000 is not allowed"),
        ({"resume": True}, "resume needs checkpoint_dir"),
        ({"commit_every": 0}, "commit_every 0 is not allowed; use a whole number >= 1"),
        ({"input_delay_rank": -1}, "input_delay_rank -1 is not allowed; use a whole number >= 0"),
        (
            {"elastic": True, "resume": True, "checkpoint_dir": Path("c")},
            "elastic and resume cannot be combined",
        ),
        ({"batch_norm": "ghost"}, "batch_norm 'ghost' is not one of: local, sync"),
        ({"lr_decay": "step"}, "lr_decay 'step' is not one of: none, cosine"),
        ({"lr_warmup_epochs": 3, "epochs": 2}, "lr_warmup_epochs 3 is not allowed; use at most"),
        (
            {"balance": "speed", "batch_norm": "sync"},
            "balance 'speed' and batch_norm 'sync' cannot be combined",
        ),
    ],
)
def test_bad_values_name_the_value_and_the_choices(changes: dict, message: str) -> None:
    with pytest.raises(SettingsError, match=message.replace("(", r"\(")):
        TrainSettings(**changes)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({"density": 0.0}, r"density=0.0 is out of range; allowed: (0.0, 1.0]"),
        ({"prune": "magic"}, "prune='magic' is not valid; allowed: ['none', 'topk', 'randomk'"),
        ({"quantize": "int4"}, "quantize='int4' is not valid; allowed: ['none', 'fp16', 'int8'"),
    ],
)
def test_compression_values_are_validated_once_by_the_config_in_its_words(
    flags: dict, message: str
) -> None:
    with pytest.raises(SettingsError) as raised:
        resolve_settings(flags, None, environ={})
    assert message in str(raised.value)
    try:
        CompressionConfig(**flags)
    except ValueError as error:
        assert str(error) == str(raised.value)  # the same words: no second validation


def test_the_compression_config_is_built_once_and_shares_momentum_and_seed(tmp_path: Path) -> None:
    config = tmp_path / "run.yaml"
    config.write_text("prune: topk\ndensity: 0.05\n")
    settings = resolve_settings(
        {"quantize": "int8", "momentum": 0.5}, config, environ={"GLOBALDL_SEED": "4"}
    )
    assert settings.compression == CompressionConfig(
        prune="topk", density=0.05, quantize="int8", momentum=0.5, seed=4
    )
    assert (settings.momentum, settings.seed) == (0.5, 4)
    with pytest.raises(SettingsError, match="momentum 0.5 differs from the compression config's"):
        TrainSettings(momentum=0.5)


def test_unknown_key_in_config_file_is_named(tmp_path: Path) -> None:
    config = tmp_path / "run.yaml"
    config.write_text("epochs: 2\nlearning-rat: 0.1\n")
    with pytest.raises(SettingsError, match="unknown setting 'learning-rat'"):
        resolve_settings({}, config, environ={})


def test_wrong_type_in_environment_names_the_variable() -> None:
    with pytest.raises(SettingsError, match=r"epochs = 'two' from \$GLOBALDL_EPOCHS"):
        resolve_settings({}, None, environ={"GLOBALDL_EPOCHS": "two"})


def test_config_file_that_is_not_a_mapping_is_rejected(tmp_path: Path) -> None:
    config = tmp_path / "run.yaml"
    config.write_text("- epochs\n- 2\n")
    with pytest.raises(SettingsError, match="must hold a mapping"):
        resolve_settings({}, config, environ={})


def test_name_lists_match_the_packages_they_mirror() -> None:
    from globaldl import models, pipelines, schedules

    assert settings_module.MODEL_NAMES == models.MODEL_NAMES
    assert settings_module.RESNET_DEPTHS == models.RESNET_DEPTHS
    assert settings_module.DATASET_NAMES == pipelines.DATASET_NAMES
    assert settings_module.LR_DECAY_NAMES == schedules.LR_DECAY_NAMES


def test_metrics_basic_auth_comes_from_a_file_and_bad_files_are_named(tmp_path: Path) -> None:
    credentials = tmp_path / "auth"
    credentials.write_text("prometheus:s3cret:with-colon\n")
    settings = TrainSettings(metrics_basic_auth_file=credentials)
    assert settings.metrics_basic_auth() == ("prometheus", "s3cret:with-colon")
    assert TrainSettings().metrics_basic_auth() is None
    credentials.write_text("no-separator\n")
    with pytest.raises(SettingsError, match=f"{credentials} must hold one line `user:password`"):
        TrainSettings(metrics_basic_auth_file=credentials)
    with pytest.raises(SettingsError, match="cannot read metrics_basic_auth_file .*missing"):
        TrainSettings(metrics_basic_auth_file=tmp_path / "missing")
