"""The training loop in rounds: local steps, a round end when the round is over, epochs.

Rounds by steps (`--sync-every 16`) are cut every H global steps, across epoch ends: every
device runs the same steps per epoch, so an epoch may end inside a round, where the checkpoint
then keeps each device's own weights and inner optimizer state. Rounds by time
(`--sync-every 2s`) let each device take the steps that fit; devices then walk through their
own shards at their own pace, and an epoch ends at the first round end after the fleet
together processed one epoch's worth of examples (known from the exchanged sample counts).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import numpy as np

from globaldl.monitoring import TrainingObserver
from globaldl.pipelines.release import release_in_background

if TYPE_CHECKING:
    from globaldl.trainer import Trainer


class LocalStream:
    """The batches of one device: epoch after epoch of its own shard, from a given epoch on."""

    def __init__(self, trainer: Trainer, epoch: int) -> None:
        self.pipeline = trainer.pipeline
        self.steps_per_epoch = trainer.steps_per_epoch
        self.epoch = epoch
        self.batch = 0
        # The current epoch's iterator, its only reference; empty before the first batch.
        self._batches: list[Any] = []

    def iterator(self) -> Any:
        """The iterator whose next batch is this device's next one."""
        if not self._batches:
            self._batches = [iter(self.pipeline.train_batches(self.epoch, self.batch))]
        return self._batches[0]

    def advance(self) -> None:
        """One batch was taken; past the shard's end, the next epoch's order starts.

        The finished epoch's iterator is destroyed off the training thread (`release`).
        """
        self.batch += 1
        if self.batch == self.steps_per_epoch:
            self.epoch, self.batch = self.epoch + 1, 0
            release_in_background(self._batches)
            self._batches = []


def fit_in_rounds(
    trainer: Trainer, observer: TrainingObserver, first_epoch: int, started: float
) -> dict[str, Any]:
    """Train `trainer` (whose `rounds` is set) from `first_epoch`; return the run summary."""
    from globaldl.run_record import EpochResult, RunTotals, run_summary

    settings, engine = trainer.settings, trainer.rounds
    assert engine is not None
    by_time = engine.interval.by_time
    epoch_examples = trainer.steps_per_epoch * trainer.global_batch_size
    stream = LocalStream(trainer, first_epoch)
    totals = RunTotals()
    history: list[dict[str, Any]] = []
    last = EpochResult(first_epoch, float("nan"), 0.0, float("nan"), 0.0, 0.0, 0.0)
    for epoch in range(first_epoch, settings.epochs):
        epoch_started = time.perf_counter()
        epoch_totals = np.zeros(3)
        steps = 0
        # Rounds by time end an epoch by the fleet's examples; rank 0's steps are a guide.
        progress = trainer.epoch_progress(epoch)
        while True:
            trainer.run_step(stream.iterator(), observer, totals, epoch_totals)
            stream.advance()
            steps += 1
            progress.step_done(min(steps, trainer.steps_per_epoch - 1) if by_time else steps)
            synced = engine.after_step(observer, totals)
            if by_time:
                # Every device learns the same totals at the same round end: all stop together.
                if synced and engine.samples_exchanged >= (epoch + 1) * epoch_examples:
                    break
            elif steps == trainer.steps_per_epoch:
                break
        last = trainer.end_epoch(epoch, epoch_totals, steps, epoch_started, observer, totals)
        history.append(last.as_dict())
    return run_summary(trainer, last, totals, history, time.perf_counter() - started, first_epoch)
