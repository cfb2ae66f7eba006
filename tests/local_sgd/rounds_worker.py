"""One horovodrun worker that trains several short runs in rounds and reports them as JSON.

Usage (under horovodrun): python rounds_worker.py OUT_DIR
Every run is a real `Trainer` on real Horovod collectives; running them in one launch pays
for starting Python, TensorFlow and the Gloo ring once instead of once per run. Rank 0
writes OUT_DIR/results.json with each run's summary and every rank's own step count.

Runs (LeNet/MNIST, 2 ranks, top-k 1% + int8, 10 steps per epoch, rounds of 4 steps, so an
epoch ends in the middle of a round):
  straight   2 epochs, overlapped, checkpoints
  first      1 epoch, overlapped, checkpoints into another folder
  resumed    the same folder, --resume, 2 epochs
  by_time    1 epoch of 0.5 s rounds; rank 1 loads every batch 150 ms slower (so it takes
             fewer steps per round) and its gradient turns NaN at its first step (step 0: a
             slow rank may take only two or three steps in the whole epoch)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import tensorflow as tf

from globaldl.compression import CompressionConfig
from globaldl.exchange import Exchange
from globaldl.monitoring import NullObserver
from globaldl.settings import TrainSettings
from globaldl.trainer import Trainer

COMMON = {
    "epochs": 2,
    "max_steps_per_epoch": 10,
    "sync_every": "4",
    "compression": CompressionConfig(prune="topk", density=0.01, quantize="int8"),
}


def train(exchange: Exchange, settings: TrainSettings) -> dict[str, Any]:
    """Train one run; add every rank's own step count to rank 0's summary."""
    trainer = Trainer(settings, exchange)
    summary = trainer.fit(NullObserver())
    steps = exchange.gather_across_ranks(tf.reshape(trainer.step, [1]), "worker_steps")
    summary["steps_by_rank"] = [int(value) for value in steps.numpy()]
    return summary


def main() -> None:
    out = Path(sys.argv[1])
    exchange = Exchange()
    rank = exchange.rank
    runs = {
        "straight": TrainSettings(
            **COMMON, overlap=True, checkpoint_dir=out / "straight", run_id="straight"
        ),
        "first": TrainSettings(
            **{**COMMON, "epochs": 1}, overlap=True, checkpoint_dir=out / "split", run_id="first"
        ),
        "resumed": TrainSettings(
            **COMMON, overlap=True, checkpoint_dir=out / "split", resume=True, run_id="resumed"
        ),
        "by_time": TrainSettings(
            **{**COMMON, "epochs": 1, "sync_every": "0.5s"},
            input_delay_ms=150.0 if rank == 1 else 0.0,
            inject_nan_step=0,
            inject_nan_rank=1,
            run_id="by_time",
        ),
    }
    results = {name: train(exchange, settings) for name, settings in runs.items()}
    if rank == 0:
        (out / "results.json").write_text(json.dumps(results, indent=1, default=str))


if __name__ == "__main__":
    main()
