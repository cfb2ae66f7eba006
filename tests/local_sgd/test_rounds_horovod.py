"""Rounds of local steps across two real Horovod ranks: equal weights, exact resume, time rounds.

One horovodrun launch trains four short runs (tests/local_sgd/rounds_worker.py) and the tests
read what each left.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from globaldl import summary as summary_module

pytestmark = pytest.mark.horovod

WORKER = Path(__file__).with_name("rounds_worker.py")
BIN = Path(sys.executable).parent
STEPS_PER_EPOCH, ROUND_STEPS = 10, 4


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, worker_env: dict[str, str]) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("rounds")
    command = [
        str(BIN / "horovodrun"), "-np", "2", "-H", "localhost:2", "--gloo",
        sys.executable, str(WORKER), str(out),
    ]  # fmt: skip
    completed = subprocess.run(
        command, env=worker_env, capture_output=True, text=True, timeout=600, check=False
    )
    assert completed.returncode == 0, completed.stdout[-4000:] + completed.stderr[-4000:]
    results = json.loads((out / "results.json").read_text())
    results["out"] = str(out)
    return results


def test_rounds_end_with_identical_weights_on_every_rank(runs: dict[str, Any]) -> None:
    straight = runs["straight"]
    summary_module.validate(straight)
    assert straight["weights_identical"], straight["weight_digests"]
    rounds = straight["rounds"]
    # 20 steps in rounds of 4: five exchanges, each applied once, in order.
    assert rounds["rounds"] == 2 * STEPS_PER_EPOCH // ROUND_STEPS
    assert rounds["rounds_applied_in_order"] and rounds["overlap"]
    assert straight["steps_by_rank"] == [2 * STEPS_PER_EPOCH] * 2
    # Top-k 1% + int8 once per 4 steps, against dense fp32 every step.
    assert rounds["bytes_per_sample_reduction"] > 4 * 50
    assert 0 < rounds["compute_utilisation"] <= 1
    assert rounds["background_exchange_seconds"] > 0
    # The round end that took round 0's result is one of the five the loop's sync time adds up.
    assert 0 < rounds["first_round_sync_seconds"] < rounds["sync_seconds"]
    # Each round's own seconds: one pair per round, adding up to the loop's sync time (the
    # drain at the end adds its wait to the total only).
    assert len(rounds["round_local_seconds"]) == len(rounds["round_sync_seconds"]) == 5
    assert min(rounds["round_local_seconds"]) > 0
    assert sum(rounds["round_sync_seconds"]) <= rounds["sync_seconds"] + 1e-5
    # With overlap the round end that took round 0's result is the second.
    # (each round's seconds are kept to the microsecond)
    assert rounds["round_sync_seconds"][1] == pytest.approx(
        rounds["first_round_sync_seconds"], abs=1e-6
    )
    # Every rank's clock times per round: no rank has a round's result before the last rank
    # handed its delta over, and each rank hands its rounds over in order.
    times = rounds["rank_round_unix_seconds"]
    assert [len(rank) for rank in times] == [5, 5]
    for index in range(5):
        handed = [rank[index][0] for rank in times]
        back = [rank[index][1] for rank in times]
        assert None not in back
        assert max(handed) <= min(back)
    for rank in times:
        assert [handed for handed, _ in rank] == sorted(handed for handed, _ in rank)


def test_a_run_resumed_mid_round_ends_as_the_uninterrupted_one(runs: dict[str, Any]) -> None:
    straight, first, resumed = runs["straight"], runs["first"], runs["resumed"]
    assert STEPS_PER_EPOCH % ROUND_STEPS != 0  # the checkpoint after epoch 1 is mid-round
    assert first["steps"] == STEPS_PER_EPOCH and resumed["resumed_from_epoch"] == 1
    # Each rank's own weights and inner optimizer state went into its own checkpoint.
    assert (Path(runs["out"]) / "split" / "rank-00001" / "epoch-0001" / "manifest.json").exists()
    assert resumed["weight_digests"] == straight["weight_digests"]
    assert resumed["val_accuracy"] == straight["val_accuracy"]


def test_wall_clock_rounds_take_uneven_steps_and_skip_a_round_with_a_nan_delta(
    runs: dict[str, Any],
) -> None:
    by_time = runs["by_time"]
    summary_module.validate(by_time)
    assert by_time["rounds"]["sync_every"] == "0.5s"
    fast, slow = by_time["steps_by_rank"]
    assert fast > slow, by_time["steps_by_rank"]  # rank 1 loads slower, nobody waits for it
    assert by_time["rounds"]["skipped_rounds"] == 1  # rank 1's NaN delta: every rank skipped
    assert by_time["weights_identical"], by_time["weight_digests"]
    assert by_time["val_loss"] > 0 and by_time["history"][-1]["val_accuracy"] > 0
