"""Resume: a run stopped after an epoch and resumed ends where an uninterrupted run ends."""

from __future__ import annotations

from pathlib import Path

import pytest
from horovod_launch import horovod_train

pytestmark = pytest.mark.horovod

SHORT = [
    "--max-steps-per-epoch",
    "15",
    "--prune",
    "topk",
    "--density",
    "0.01",
    "--quantize",
    "int8",
]


def test_resume_after_epoch_one_gives_bitwise_the_same_weights_as_an_uninterrupted_run(
    tmp_path: Path, worker_env: dict[str, str]
) -> None:
    straight, _ = horovod_train(
        tmp_path / "straight",
        ["--epochs", "2", "--checkpoint-dir", str(tmp_path / "a"), *SHORT],
        worker_env,
    )
    checkpoints = tmp_path / "b"
    first, _ = horovod_train(
        tmp_path / "first",
        ["--epochs", "1", "--checkpoint-dir", str(checkpoints), *SHORT],
        worker_env,
    )
    resumed, _ = horovod_train(
        tmp_path / "resumed",
        ["--epochs", "2", "--checkpoint-dir", str(checkpoints), "--resume", *SHORT],
        worker_env,
    )
    assert first["steps"] == 15 and resumed["steps"] == 15  # the resumed run did epoch 2 only
    assert resumed["resumed_from_epoch"] == 1
    # Each rank kept its own error-feedback residuals, so the resumed run is exact.
    assert (checkpoints / "rank-00001" / "epoch-0001" / "manifest.json").exists()
    assert resumed["weights_identical"]
    assert resumed["weight_digests"] == straight["weight_digests"]
    assert resumed["val_accuracy"] == straight["val_accuracy"]
