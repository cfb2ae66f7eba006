"""`--balance speed` across two real Horovod ranks: batches by speed, one true-average update."""

from __future__ import annotations

from pathlib import Path

import pytest
from horovod_launch import horovod_train

from globaldl import summary as summary_module

pytestmark = pytest.mark.horovod


def test_balance_speed_splits_the_global_batch_and_ranks_stay_identical(
    tmp_path: Path, venv_bin: Path, worker_env: dict[str, str]
) -> None:
    result, completed = horovod_train(
        tmp_path,
        ["--model", "lenet", "--dataset", "mnist", "--epochs", "2", "--balance", "speed"],
        worker_env,
    )
    summary_module.validate(result)
    assert result["balance"] == "speed"
    speeds = result["measured_speeds"]
    assert len(speeds) == 2 and all(speed > 0 for speed in speeds)
    sizes = result["rank_batch_sizes"]
    assert sum(sizes) == result["global_batch_size"] == 32 and min(sizes) >= 1
    # The faster rank never gets the smaller batch.
    assert (sizes[0] - sizes[1]) * (speeds[0] - speeds[1]) >= 0
    assert "balance speed: examples/s per rank" in completed.stdout
    assert result["weights_identical"], result["weight_digests"]
    assert result["val_accuracy"] >= 0.90
