"""Elastic training under real Horovod Elastic: a worker dies, a worker joins, too few remain.

Workers run on this machine under two host names (`localhost`, `127.0.0.1`) so that Horovod's
blacklisting of a failed host takes out only the worker that failed. A device "dies" when the
test SIGKILLs the worker process Horovod started for host `127.0.0.1`, mid-epoch.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
from horovod_launch import ElasticLaunch

from globaldl import summary as summary_module

pytestmark = pytest.mark.horovod

COMMIT_EVERY = 10
# LeNet on the MNIST subset, 4 epochs (3 leave ~1 point of run-to-run spread): 4000 examples
# / (3 x 16) = 83 steps per epoch.
TRAIN = [
    "--model",
    "lenet",
    "--dataset",
    "mnist",
    "--epochs",
    "4",
    "--commit-every",
    str(COMMIT_EVERY),
    "--seed",
    "0",
]
KILL_AFTER_EPOCH_SECONDS = 3.0  # into the second epoch (an epoch takes ~15-40 s here)
# Learning survives the kill: the floor the joined run is held to too. One killed run against one
# uninterrupted one said little more (4 epochs leave run-to-run spread; CI, 2026-11-26: 0.944
# against 0.958) and cost a third run; the 1-point loss target is evaluated by
# `globaldl experiment chaos` on medians of repeats.
MIN_ACCURACY = 0.90
# A survivor notices a dead peer either at once (connection reset) or when Gloo's wait for it
# times out: rings form under the 60 s join timeout and train under the 10 s collective one.
GLOO_TIMEOUT = {
    "GLOBALDL_GLOO_JOIN_TIMEOUT_SECONDS": "60",
    "GLOBALDL_GLOO_COLLECTIVE_TIMEOUT_SECONDS": "10",
}


def _env(worker_env: dict[str, str]) -> dict[str, str]:
    return {**worker_env, **GLOO_TIMEOUT}


def test_elastic_kill_one_of_three_workers_and_the_run_completes(
    tmp_path: Path, venv_bin: Path, worker_env: dict[str, str]
) -> None:
    launch = ElasticLaunch(
        tmp_path,
        TRAIN,
        _env(worker_env),
        ["localhost:2", "127.0.0.1:1"],
        np=3,
        min_np=2,
        max_np=3,
    )
    launch.wait_for_line(r"epoch 1/4", timeout_seconds=300)
    time.sleep(KILL_AFTER_EPOCH_SECONDS)
    killed_at = time.time()
    launch.kill_worker_on("127.0.0.1")
    result = launch.summary()
    summary_module.validate(result)
    elastic = result["elastic"]
    assert elastic["sizes"] == [3, 2], elastic
    assert result["ranks"] == 2 and result["weights_identical"], result["weight_digests"]
    [event] = elastic["events"]
    assert event["reason"] == "failure" and event["size_before"] == 3
    assert event["size_after"] == 2
    assert 0 <= event["lost_steps"] <= COMMIT_EVERY
    assert event["step"] % COMMIT_EVERY == 0 or event["step"] % 83 == 0, event
    assert killed_at < event["detected_at"] < event["first_step_at"]
    # Every ring trained under the collective timeout: LeNet's steps never needed a longer one.
    assert elastic["gloo_collective_timeout_seconds"] == 10, elastic
    assert elastic["collective_timeout_changes"] == [], elastic
    # The learning rate and the global batch follow the new size.
    assert result["learning_rate"] == pytest.approx(0.01 * 2)
    assert result["global_batch_size"] == 16 * 2
    assert result["val_accuracy"] >= MIN_ACCURACY, result["val_accuracy"]


def test_elastic_worker_joins_mid_run_and_ends_with_the_same_weights(
    tmp_path: Path, venv_bin: Path, worker_env: dict[str, str]
) -> None:
    # The grown ring forms under the join timeout (60 s by default), which waits for the new
    # worker to start Python and TensorFlow, while every collective waits only 5 s.
    launch = ElasticLaunch(
        tmp_path,
        TRAIN,
        {**worker_env, "GLOBALDL_GLOO_COLLECTIVE_TIMEOUT_SECONDS": "5"},
        ["localhost:2"],
        np=2,
        min_np=2,
        max_np=3,
    )
    launch.wait_for_line(r"epoch 1/4", timeout_seconds=300)
    launch.set_hosts(["localhost:2", "127.0.0.1:1"])
    result = launch.summary()
    summary_module.validate(result)
    elastic = result["elastic"]
    assert elastic["sizes"] == [2, 3], elastic
    assert [event["reason"] for event in elastic["events"]] == ["hosts_changed"]
    assert elastic["gloo_collective_timeout_seconds"] == 5, elastic
    assert elastic["collective_timeout_changes"] == [], elastic
    assert elastic["lost_steps"] == 0
    assert result["ranks"] == 3
    assert len(result["weight_digests"]) == 3 and result["weights_identical"], result[
        "weight_digests"
    ]
    assert result["val_accuracy"] >= MIN_ACCURACY, result["val_accuracy"]


def test_elastic_steps_too_slow_for_the_collective_timeout_loosen_it_once(
    tmp_path: Path, venv_bin: Path, worker_env: dict[str, str]
) -> None:
    # Every batch waits 0.4 s in the input pipeline: 4x the slowest step is at least 2 s,
    # longer than the 1 s collective timeout the ring starts with.
    slow = ["--input-delay-ms", "400", "--epochs", "1", "--max-steps-per-epoch", "24"]
    launch = ElasticLaunch(
        tmp_path,
        [*TRAIN[:4], *slow, "--commit-every", "5", "--seed", "0"],
        {**worker_env, "GLOBALDL_GLOO_COLLECTIVE_TIMEOUT_SECONDS": "1"},
        ["localhost:2"],
        np=2,
        min_np=2,
        max_np=2,
    )
    result = launch.summary()
    summary_module.validate(result)
    elastic = result["elastic"]
    [change] = elastic["collective_timeout_changes"]
    # After 3 timed steps, at the next commit (step 5 or 10): one re-formation, same members.
    assert change["step"] in (5, 10) and change["seconds"] >= 2, change
    assert elastic["gloo_collective_timeout_seconds"] == change["seconds"], elastic
    assert elastic["sizes"] == [2] and elastic["events"] == [], elastic
    assert result["weights_identical"], result["weight_digests"]


def test_elastic_below_min_np_stops_within_the_elastic_timeout(
    tmp_path: Path, venv_bin: Path, worker_env: dict[str, str]
) -> None:
    launch = ElasticLaunch(
        tmp_path,
        TRAIN,
        _env(worker_env),
        ["localhost:1", "127.0.0.1:1"],
        np=2,
        min_np=2,
        max_np=2,
        elastic_timeout_seconds=10,
    )
    launch.wait_for_line(r"epoch 1/4", timeout_seconds=300)
    launch.kill_worker_on("127.0.0.1")
    killed = time.monotonic()
    code = launch.finish(timeout_seconds=180)
    waited = time.monotonic() - killed
    assert code != 0, launch.output[-3000:]
    assert "minimum number of slots" in launch.output, launch.output[-3000:]
    # Gloo's timeout (10 s) to notice, the elastic timeout (10 s) to give up, and shutdown.
    assert waited < 90, waited
    assert not launch.summary_path.exists()


def test_elastic_bad_discovery_output_fails_at_once_with_the_bad_line(
    tmp_path: Path, venv_bin: Path, worker_env: dict[str, str]
) -> None:
    launch = ElasticLaunch(
        tmp_path, TRAIN, _env(worker_env), ["localhost:two"], np=2, min_np=1, max_np=2
    )
    started = time.monotonic()
    code = launch.finish(timeout_seconds=120)
    assert code != 0
    assert time.monotonic() - started < 60
    # Horovod's discovery thread raises a ValueError naming 'two' while the main thread shuts
    # the job down; which of the two messages reaches the output before exit varies.
    assert "two" in launch.output or "Job has been shutdown" in launch.output, launch.output[-3000:]
    assert not launch.summary_path.exists()


def test_corrupt_host_file_fails_at_once_with_horovods_message(
    tmp_path: Path, venv_bin: Path, worker_env: dict[str, str]
) -> None:
    """A host file Horovod cannot parse stops horovodrun before any worker starts."""
    host_file = tmp_path / "hosts"
    host_file.write_text("localhost slots=two\n")
    started = time.monotonic()
    completed = subprocess.run(
        [str(venv_bin / "horovodrun"), "-np", "2", "-hostfile", str(host_file), "--gloo",
         str(venv_bin / "globaldl"), "train"],
        env=worker_env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert completed.returncode != 0
    assert "Invalid host input" in completed.stderr, completed.stderr[-2000:]
    assert time.monotonic() - started < 30
