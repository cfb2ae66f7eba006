"""Real Horovod: two worker processes launched by horovodrun, exchanging gradients over Gloo."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
from horovod_launch import horovod_train

from globaldl import horovod_edits
from globaldl import summary as summary_module

pytestmark = pytest.mark.horovod

# Measured on the reference machine (2 cores), LeNet on the MNIST subset, 2 ranks, seed 0:
# dense 2 epochs 0.962, dense 3 epochs 0.946; top-k 1% + int8, 3 epochs 0.939 (README).
MIN_VAL_ACCURACY_DENSE = 0.90
MAX_COMPRESSED_ACCURACY_LOSS = 0.015
RECOMMENDED = ["--prune", "topk", "--density", "0.01", "--quantize", "int8"]


# One dense run serves both the dense checks and the compressed run's baseline: each run
# costs about 35 s of the suite's 30 minutes.
@pytest.fixture(scope="module")
def dense_three_epochs(
    tmp_path_factory: pytest.TempPathFactory, venv_bin: Path, worker_env: dict[str, str]
) -> tuple[dict[str, Any], subprocess.CompletedProcess[str]]:
    return horovod_train(
        tmp_path_factory.mktemp("dense"),
        ["--model", "lenet", "--dataset", "mnist", "--epochs", "3"],
        worker_env,
    )


def test_two_ranks_train_lenet_on_mnist_to_identical_weights(
    dense_three_epochs: tuple[dict[str, Any], subprocess.CompletedProcess[str]],
) -> None:
    result, completed = dense_three_epochs
    summary_module.validate(result)
    assert result["ranks"] == 2
    assert result["weights_identical"], result["weight_digests"]
    assert len(result["weight_digests"]) == 2
    assert result["val_accuracy"] >= MIN_VAL_ACCURACY_DENSE
    assert result["steps"] == 3 * (4000 // 2 // 16)
    phases = result["phase_seconds"]
    assert phases["compute"] > 0 and phases["exchange"] > 0 and phases["data_load"] > 0
    # Every rank's own totals, gathered: rank 0's entry is the summary's phase_seconds.
    assert [entry["phase_seconds"] for entry in result["rank_totals"][:1]] == [phases]
    assert len(result["rank_totals"]) == 2
    assert all(entry["cpu_seconds"] > 0 for entry in result["rank_totals"])
    # CPU inside the steps: every step but the traced first, less than the whole run's CPU.
    for entry in result["rank_totals"]:
        assert entry["step_cpu_steps"] == result["steps"] - 1
        assert 0 < entry["step_cpu_seconds"] < entry["cpu_seconds"]
        # The first step's phases, part of the run's: the steady steps are the difference.
        first = entry["first_step_phase_seconds"]
        assert first.keys() == entry["phase_seconds"].keys()
        assert 0 < sum(first.values()) < sum(entry["phase_seconds"].values())
        assert all(first[name] <= entry["phase_seconds"][name] for name in first)
    # The loop's wall a step: the cycles from each epoch's second step on (3 epochs), the
    # cycle of an epoch's first step left out; at least what the phases timed of them.
    steps_per_epoch = result["steps"] // 3
    assert result["step_wall_steps"] == 3 * (steps_per_epoch - 2)
    assert result["versions"]["horovod_edits"] == list(horovod_edits.installed())
    assert horovod_edits.ALLGATHER_RECEIVE_FIRST in result["versions"]["horovod_edits"]
    steady = sum(phases.values()) - sum(
        result["rank_totals"][0]["first_step_phase_seconds"].values()
    )
    assert result["step_wall_seconds"] / result["step_wall_steps"] >= 0.9 * steady / (
        result["steps"] - 1
    )
    # Uncompressed: every gradient went dense in fp32, plus one fp32 NaN/Inf flag per step.
    assert result["gradient_bytes_wire"] == result["gradient_bytes_raw"] + 4 * result["steps"]
    assert "epoch 3/3" in completed.stdout  # the progress line, from rank 0


def test_topk_int8_compresses_50x_and_stays_within_1_5_points_of_dense(
    tmp_path: Path,
    dense_three_epochs: tuple[dict[str, Any], subprocess.CompletedProcess[str]],
    worker_env: dict[str, str],
) -> None:
    dense, _ = dense_three_epochs
    result, _ = horovod_train(tmp_path, ["--epochs", "3", *RECOMMENDED], worker_env)
    assert result["weights_identical"]
    assert result["compression_ratio"] >= 50
    assert result["compression_ratio"] == pytest.approx(
        result["gradient_bytes_raw"] / result["gradient_bytes_wire"]
    )
    assert result["gradient_bytes_raw"] == dense["gradient_bytes_raw"]
    assert result["phase_seconds"]["compress"] > 0 and result["phase_seconds"]["decompress"] > 0
    assert result["val_accuracy"] >= dense["val_accuracy"] - MAX_COMPRESSED_ACCURACY_LOSS


@pytest.mark.parametrize(
    "flags",
    [
        ["--quantize", "fp16"],  # summable: fp16 allreduce, Horovod's own compression
        ["--prune", "dgc", "--density", "0.01", "--quantize", "sign", "--warmup-epochs", "1"],
        ["--prune", "threshold", "--density", "0.01", "--quantize", "qsgd"],  # variable length
        ["--prune", "randomk", "--density", "0.05", "--quantize", "terngrad"],
    ],
    ids=["fp16-allreduce", "dgc-sign", "threshold-qsgd", "randomk-terngrad"],
)
def test_every_rank_ends_with_identical_weights_under_compression(
    tmp_path: Path, worker_env: dict[str, str], flags: list[str]
) -> None:
    result, _ = horovod_train(
        tmp_path, ["--epochs", "1", "--max-steps-per-epoch", "25", *flags], worker_env
    )
    assert result["weights_identical"], result["weight_digests"]
    assert result["steps"] == 25 and result["skipped_steps"] == 0
    assert 0 < result["gradient_bytes_wire"] < result["gradient_bytes_raw"]


@pytest.mark.parametrize("flags", [[], RECOMMENDED], ids=["dense-allreduce", "topk-int8-allgather"])
def test_nan_gradients_on_one_rank_make_every_rank_skip_the_same_step(
    tmp_path: Path, worker_env: dict[str, str], flags: list[str]
) -> None:
    result, _ = horovod_train(
        tmp_path,
        [
            "--epochs",
            "1",
            "--max-steps-per-epoch",
            "20",
            "--inject-nan-step",
            "5",
            "--inject-nan-rank",
            "1",
            *flags,
        ],
        worker_env,
    )
    assert result["steps"] == 20
    assert result["skipped_steps"] == 1
    assert result["weights_identical"], result["weight_digests"]
    assert result["val_loss"] > 0 and result["history"][0]["loss"] == result["history"][0]["loss"]
