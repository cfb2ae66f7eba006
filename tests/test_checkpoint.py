from __future__ import annotations

from pathlib import Path

import pytest
import tensorflow as tf

from globaldl import checkpoint
from globaldl.checkpoint import CheckpointError


def _state(value: float) -> tuple[tf.train.Checkpoint, tf.Variable]:
    variable = tf.Variable(tf.fill([4], value))
    return tf.train.Checkpoint(weights=variable), variable


def test_save_then_restore_gives_back_the_values(tmp_path: Path) -> None:
    state, _ = _state(1.5)
    checkpoint.save(tmp_path, 1, state, {"step": 10})
    restored, variable = _state(0.0)
    manifest = checkpoint.restore(tmp_path, 1, restored)
    assert variable.numpy().tolist() == [1.5] * 4
    assert manifest["step"] == 10


def test_only_the_newest_checkpoints_are_kept(tmp_path: Path) -> None:
    state, _ = _state(1.0)
    for epoch in range(1, 6):
        checkpoint.save(tmp_path, epoch, state, {})
    assert checkpoint.available_epochs(tmp_path) == [5, 4, 3]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging left


def test_corrupt_checkpoint_is_named_and_the_previous_good_one_is_used(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    for epoch, value in ((1, 1.0), (2, 2.0)):
        state, _ = _state(value)
        checkpoint.save(tmp_path, epoch, state, {})
    data = next((tmp_path / "epoch-0002").glob("state.data-*"))
    data.write_bytes(data.read_bytes()[:-3])  # truncated
    found = checkpoint.latest_good(tmp_path)
    assert found is not None and found[0] == 1
    assert str(data) in caplog.text and "corrupted" in caplog.text
    with pytest.raises(CheckpointError, match=str(data)):
        checkpoint.restore(tmp_path, 2, _state(0.0)[0])
    restored, variable = _state(0.0)
    checkpoint.restore(tmp_path, 1, restored)
    assert variable.numpy().tolist() == [1.0] * 4


def test_missing_manifest_is_reported(tmp_path: Path) -> None:
    state, _ = _state(1.0)
    checkpoint.save(tmp_path, 1, state, {})
    (tmp_path / "epoch-0001" / "manifest.json").unlink()
    with pytest.raises(CheckpointError, match="manifest.json is unreadable"):
        checkpoint.verify(tmp_path / "epoch-0001")
    assert checkpoint.latest_good(tmp_path) is None


def test_unwritable_checkpoint_directory_is_refused() -> None:
    with pytest.raises(CheckpointError, match="/proc/globaldl-ckpt is not writable"):
        checkpoint.check_writable(Path("/proc/globaldl-ckpt"))
