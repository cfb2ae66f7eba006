"""Batch normalisation across real Horovod ranks: every rank ends with identical weights.

Each rank's batch normalisation updates its moving mean and variance from its own batches;
before the fix every multi-rank ResNet summary said `weights_identical: false`. The moving
statistics are now averaged before validation, checkpoints, the final digest and at every
elastic commit. A few steps of ResNet-8 suffice: one step already makes the ranks differ.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from horovod_launch import BIN, ElasticLaunch, horovod_train

from globaldl import summary as summary_module

pytestmark = pytest.mark.horovod

RESNET8 = [
    "--model",
    "resnet",
    "--depth",
    "8",
    "--dataset",
    "cifar-synthetic",
    "--batch-size",
    "8",
    "--max-steps-per-epoch",
    "3",
]


def test_two_ranks_train_resnet_to_identical_weights_and_resume_identical(
    tmp_path: Path, venv_bin: Path, worker_env: dict[str, str]
) -> None:
    checkpoints = tmp_path / "checkpoints"
    first, _ = horovod_train(
        tmp_path / "first",
        [*RESNET8, "--epochs", "1", "--checkpoint-dir", str(checkpoints)],
        worker_env,
    )
    summary_module.validate(first)
    assert first["ranks"] == 2 and first["model_options"]["batch_norm"] == "local"
    assert first["weights_identical"] is True, first["weight_digests"]
    resumed, _ = horovod_train(
        tmp_path / "resumed",
        [*RESNET8, "--epochs", "2", "--checkpoint-dir", str(checkpoints), "--resume"],
        worker_env,
    )
    assert resumed["resumed_from_epoch"] == 1 and resumed["steps"] == 3
    assert resumed["weights_identical"] is True, resumed["weight_digests"]


def test_elastic_resnet_commits_leave_every_worker_identical(
    tmp_path: Path, venv_bin: Path, worker_env: dict[str, str]
) -> None:
    launch = ElasticLaunch(
        tmp_path,
        [*RESNET8, "--epochs", "2", "--commit-every", "2"],
        worker_env,
        ["localhost:1", "127.0.0.1:1"],
        np=2,
        min_np=2,
        max_np=2,
    )
    result = launch.summary()
    assert result["ranks"] == 2 and result["elastic"]["resets"] == 0
    assert result["weights_identical"] is True, result["weight_digests"]


def test_horovod_sync_batch_norm_runs_under_tf_keras_and_gloo_with_two_collectives_per_layer(
    tmp_path: Path, venv_bin: Path, worker_env: dict[str, str]
) -> None:
    out = tmp_path / "bench.json"
    command = [
        str(BIN / "horovodrun"),
        "-np",
        "2",
        "-H",
        "localhost:2",
        "--gloo",
        sys.executable,
        "-m",
        "globaldl.bench.batchnorm_worker",
        "--out",
        str(out),
        "--order",
        "resnet-8:local,resnet-8:sync",
        "--steps",
        "1",
        "--warmup-steps",
        "1",
        "--averagings",
        "1",
        "--batch-size",
        "4",
    ]
    completed = subprocess.run(
        command, env=worker_env, capture_output=True, text=True, timeout=600, check=False
    )
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    document = json.loads(out.read_text())
    local, sync = document["rows"]
    assert document["ranks"] == 2
    assert local["batch_norm_layers"] == sync["batch_norm_layers"] == 9
    # Dense fp32 gradients: one allreduce per step; sync adds one per layer each way.
    assert local["collectives_per_step"] == 1
    assert sync["collectives_per_step"] == 1 + 2 * 9
    # The averaging of all 18 moving statistics is one fused collective.
    assert local["averaging_collectives"] == sync["averaging_collectives"] == 1
