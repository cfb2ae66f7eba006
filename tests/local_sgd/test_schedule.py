"""`--sync-every`: steps or a wall-clock budget, and the combinations rounds refuse."""

from __future__ import annotations

from pathlib import Path

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
        resolve_settings(changes, None, environ={})


def test_rounds_compose_with_compression_balance_elastic_and_overlap() -> None:
    flags = {"sync_every": "16", "prune": "topk", "quantize": "int8", "overlap": True}
    resolve_settings({**flags, "elastic": True}, None, environ={})
    TrainSettings(sync_every="2s", balance="speed", outer_optimizer="nesterov")


@pytest.mark.parametrize(
    ("prune", "quantize"),
    [("powersgd", "none"), ("shared-topk", "intsum"), ("shared-randomk", "fp16")],
)
def test_rounds_take_the_summable_codecs_and_the_site_hierarchy(
    tmp_path: Path, prune: str, quantize: str
) -> None:
    site_map = tmp_path / "sites.yaml"
    site_map.write_text("sites:\n  a: [10.0.0.2]\n  b: [10.0.0.3]\n")
    flags = {"sync_every": "16", "overlap": True, "prune": prune, "quantize": quantize}
    settings = resolve_settings(
        {**flags, "hierarchy": "sites", "sites_file": str(site_map)}, None, environ={}
    )
    assert settings.sync_interval.steps == 16
    assert (settings.compression.prune, settings.hierarchy) == (prune, "sites")
