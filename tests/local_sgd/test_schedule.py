"""`--sync-every`: steps or a wall-clock budget, and the combinations rounds refuse."""

from __future__ import annotations

import pytest

from globaldl.local_sgd.schedule import SyncInterval
from globaldl.settings import SettingsError, TrainSettings, resolve_settings


@pytest.mark.parametrize(
    ("text", "steps", "seconds"),
    [("1", 1, None), ("16", 16, None), (64, 64, None), ("2s", None, 2.0), ("0.5 s", None, 0.5)],
)
def test_sync_every_reads_steps_or_seconds(text: object, steps: int, seconds: float) -> None:
    interval = SyncInterval.parse(text)
    assert (interval.steps, interval.seconds) == (steps, seconds)
    assert SyncInterval.parse(str(interval)) == interval


@pytest.mark.parametrize("text", ["0", "-4", "2.5", "s", "0s", "2m", "nan s", True])
def test_bad_sync_every_names_the_value_and_what_is_allowed(text: object) -> None:
    with pytest.raises(SettingsError, match=r"sync_every .* is not allowed; use a whole number"):
        TrainSettings(sync_every=text)  # type: ignore[arg-type]


def test_sync_every_comes_from_flags_files_and_the_environment_as_one_value() -> None:
    settings = resolve_settings({}, None, environ={"GLOBALDL_SYNC_EVERY": "16"})
    assert settings.sync_interval == SyncInterval(steps=16)
    assert TrainSettings().sync_interval.per_step
    assert TrainSettings(sync_every="2s").replace(epochs=3).sync_interval.by_time


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"overlap": True}, "overlap needs sync_every > 1"),
        ({"outer_optimizer": "nesterov"}, "apply to rounds of local steps"),
        ({"sync_every": "8", "prune": "dgc"}, "prune 'dgc' cannot be combined with sync_every"),
        ({"sync_every": "8", "weight_sparsity": 0.5}, "weight_sparsity cannot be combined"),
        ({"sync_every": "2s", "elastic": True}, "wall-clock sync_every and elastic"),
        ({"sync_every": "8", "outer_optimizer": "adam"}, "outer_optimizer 'adam' is not one of"),
        ({"sync_every": "8", "outer_lr": 0.0}, "outer_lr 0.0 is not allowed"),
        ({"sync_every": "8", "outer_momentum": 1.0}, "outer_momentum 1.0 is not allowed"),
    ],
)
def test_combinations_that_make_no_sense_in_rounds_are_refused(changes: dict, message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        TrainSettings(**changes)


def test_rounds_compose_with_compression_balance_elastic_and_overlap() -> None:
    TrainSettings(sync_every="16", prune="topk", quantize="int8", overlap=True, elastic=True)
    TrainSettings(sync_every="2s", balance="speed", outer_optimizer="nesterov")
