"""The end of a round: the pseudo-gradient through the codecs, the outer step, the next start.

Per round, on every device (`RoundEngine.end_round`)::

    delta      = round_start - weights                  # this round's local progress, negated
    payload    = compressor.compress(weight_i * delta)  # prune, quantize, error feedback
    exchanged  = allreduce or allgather of payload      # what the codec declares
    average    = compressor.decompress(exchanged)       # the fleet's mean, weighted by samples
    anchor     = outer_optimizer(anchor, average)       # the global weights, identical everywhere
    weights    = round_start = anchor                   # the next round starts from them

`weight_i` makes the average a mean over the examples the devices processed: with equal
batches and steps it is 1; with `--balance speed` it is the device's batch share (as for
gradients, `globaldl.balance`); with a wall-clock round, where devices take different numbers
of steps, every device sends `samples_i / batch_size` times its delta and the average is
rescaled by the fleet's total samples, which travels in a second small allreduce.

With overlap, round t's exchange runs on a background thread (`overlap.py`) while round t+1's
local steps compute. At the end of round t+1 the device waits for round t, applies it to the
anchor, submits round t+1, and continues from `anchor - delta_{t+1}`: the global weights with
every round up to t, plus its own progress of round t+1, which the average replaces when it
arrives one round later. A device's own contribution is therefore on its weights exactly until
the average that contains it is applied: no round is applied twice or skipped (`RoundLedger`
checks the order), and after the last exchange every device holds the anchor.

The inner optimizer's state (SGD momentum, Adam's moments) stays local, as in DiLoCo: it is
neither averaged nor reset at a sync, and it is checkpointed per device. Non-trainable floats
(batch-norm statistics) are averaged plainly at each round, outside the outer optimizer.

Non-finite deltas: the codec carries each device's flag; when any device sent one, every
device skips the round (anchor, residuals and outer state unchanged), and the device whose
delta was non-finite restarts from the anchor with its non-finite optimizer slots zeroed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import tensorflow as tf

from globaldl.balance import gradient_weight
from globaldl.local_sgd import outer as outer_optimizers
from globaldl.local_sgd.outer import serialize
from globaldl.local_sgd.overlap import PendingRound, RoundLedger, run_in_background
from globaldl.local_sgd.round_graph import Contribution, RoundGraph, RoundResult
from globaldl.local_sgd.schedule import SyncInterval, outer_momentum
from globaldl.monitoring import PHASES, TrainingObserver
from globaldl.optimizers import optimizer_variables

if TYPE_CHECKING:  # the trainer imports this module
    from globaldl.run_record import RunTotals
    from globaldl.trainer import Trainer

SYNC_PHASES = ("compress", "exchange", "decompress")


@dataclass
class RoundTotals:
    """What this device adds up over its rounds, for the summary."""

    rounds: int = 0
    skipped_rounds: int = 0
    sync_seconds: float = 0.0  # the training loop's own time at round ends (waits included)
    background_seconds: float = 0.0  # exchanges that ran beside the local steps (overlap)
    # The loop's time at the round end that took the first round's result: its collectives
    # meet their tensors for the first time (Horovod's full negotiation), like a run's first
    # step, so a reader of the steady round leaves it out.
    first_round_sync_seconds: float | None = None
    # Each round's own seconds, in order: the local steps' wall (from the round's start to its
    # end) and the loop's time at its end. Their spread is what a mean hides: whether a round
    # ends just before or just after one of Horovod's coordination cycles begins.
    round_local_seconds: list[float] = field(default_factory=list)
    round_sync_seconds: list[float] = field(default_factory=list)
    # Each round's clock times on this device, [handed, back] (Unix seconds; every device of an
    # emulated fleet reads one clock): when the loop handed its delta to the exchange, and when
    # the exchange's result was back here (None until it is). Set side by side across ranks,
    # they show which device a round waited for.
    round_clock_unix: list[list[float | None]] = field(default_factory=list)


class RoundEngine:
    """Decides when a round ends and what is in flight; `RoundGraph` does the work."""

    def __init__(
        self,
        graph: RoundGraph,
        *,
        interval: SyncInterval,
        overlap: bool,
        batch_size: int,
        global_batch_size: int,
        sample_weight: float,
        nominal_batch_size: int,
    ) -> None:
        if interval.per_step:
            raise ValueError("a RoundEngine needs sync_every > 1 (1 is the per-step exchange)")
        self.graph = graph
        self.interval = interval
        self.overlap = overlap
        self.batch_size = batch_size
        self.global_batch_size = global_batch_size
        self.sample_weight = sample_weight
        self.nominal_batch_size = nominal_batch_size
        self.ledger = RoundLedger()
        self.totals = RoundTotals()
        self.pending: PendingRound | None = None
        self._first_index = 0  # the first round this engine submits (traced before it runs)
        self.steps_in_round = 0
        self.samples_in_round = 0
        self.round_started = time.perf_counter()

    # ------------------------------------------------------------------ state
    def shared_variables(self) -> list[tf.Variable]:
        """Identical on every device: the global weights, the outer state, the counters."""
        return self.graph.shared_variables()

    def checkpoint(self) -> tf.train.Checkpoint:
        """The shared part as a checkpoint object (rank 0 writes it)."""
        return tf.train.Checkpoint(
            **{f"shared_{index}": v for index, v in enumerate(self.shared_variables())}
        )

    def start(self) -> None:
        """A fresh run: the broadcast initial weights become the global weights."""
        self.graph.start_from_weights()
        self._restart_bookkeeping(step=0)

    def after_restore(self, step: int, own_state_found: bool) -> None:
        """Continue from a checkpoint or an elastic commit: no exchange in flight.

        Every checkpoint and commit is taken with nothing in flight, where the round started
        from the anchor. A device without its own saved weights restarts its round from the
        anchor (its unsaved local progress is lost).
        """
        self.graph.start_from_anchor(weights_too=not own_state_found)
        self._restart_bookkeeping(step)

    def _restart_bookkeeping(self, step: int) -> None:
        self.pending = None
        self.ledger.restart_at(int(self.graph.rounds.numpy()))
        self._first_index = self.ledger.submitted
        # Rounds by steps are cut every H global steps from step 0 (a partial last round is
        # exchanged only when training ends, after its checkpoint), so the position follows.
        self.steps_in_round = 0 if self.interval.by_time else step % int(self.interval.steps or 1)
        self.samples_in_round = self.steps_in_round * self.batch_size
        self.round_started = time.perf_counter()

    @property
    def samples_exchanged(self) -> float:
        """Examples the whole fleet processed in the rounds applied so far."""
        return float(self.graph.samples.numpy())

    def global_weights(self) -> Any:
        """A context in which the model holds the global weights (for validation)."""
        return self.graph.global_weights()

    # ------------------------------------------------------------------ the loop's hooks
    @property
    def at_sync_point(self) -> bool:
        """Every device holds the global weights and nothing is in flight."""
        return self.steps_in_round == 0 and self.pending is None

    def after_step(self, observer: TrainingObserver, totals: RunTotals) -> bool:
        """Count the local step just taken; end the round when it is over. True if it ended."""
        self.steps_in_round += 1
        self.samples_in_round += self.batch_size
        if self.interval.by_time:
            over = time.perf_counter() - self.round_started >= float(self.interval.seconds or 0)
        else:
            over = self.steps_in_round >= int(self.interval.steps or 1)
        if over:
            self.end_round(observer, totals)
        return over

    def end_round(self, observer: TrainingObserver, totals: RunTotals) -> None:
        """Exchange this round's delta (or submit it, with overlap) and start the next round."""
        local_seconds = time.perf_counter() - self.round_started
        contribution = self._contribution()
        index = self.ledger.submit()
        if not self.overlap:
            position = self._handed()
            result, apply_seconds = self.graph.sync_round(contribution)
            self._back(position)
            self._applied(index, result)
            seconds = dict(zip(SYNC_PHASES, result.phase_seconds.numpy().tolist(), strict=True))
            seconds["apply"] = float(apply_seconds)
        else:
            waited, result = 0.0, None
            if self.pending is None:
                turn = self.graph.first_turn()
            else:
                waited, result = self._wait(self.pending)
                turn = self.graph.turn(result)
                self._applied(self.pending.index, result)
            arguments = (turn.deltas, contribution, turn.statistics)
            if index == self._first_index:
                # Traced here, not on the background thread, where the loop would wait for it
                # (the steps' and the in-place rounds' tracing is untimed too).
                self.graph.exchange_round.get_concrete_function(*arguments)
            position = self._handed()
            future = run_in_background(self.graph.exchange_round, *arguments)
            future.add_done_callback(lambda _: self._back(position))
            self.pending = PendingRound(index, future)
            seconds = {"exchange": waited, "apply": float(turn.seconds)}
        sync_seconds = self._report(observer, totals, seconds, result)
        self.totals.round_local_seconds.append(local_seconds)
        self.totals.round_sync_seconds.append(sync_seconds)
        self.steps_in_round = 0
        self.samples_in_round = 0
        self.round_started = time.perf_counter()

    def _handed(self) -> int:
        """Note the clock as the loop hands a round's delta over; returns the round's position."""
        self.totals.round_clock_unix.append([time.time(), None])
        return len(self.totals.round_clock_unix) - 1

    def _back(self, position: int) -> None:
        """The exchange handed over at round end `position` is back (the exchange thread)."""
        self.totals.round_clock_unix[position][1] = time.time()

    def drain(self, observer: TrainingObserver, totals: RunTotals) -> None:
        """Wait for the round in flight and apply it; keep this round's progress on top.

        Called at epoch ends and before commits, so that validation sees every finished round
        and checkpoints hold nothing in flight. Without overlap there is nothing to do.
        """
        if self.pending is None:
            return
        pending, self.pending = self.pending, None
        waited, result = self._wait(pending)
        seconds = {"exchange": waited, "apply": float(self.graph.drain(result))}
        self._applied(pending.index, result)
        self._report(observer, totals, seconds, result)

    def finish(self, observer: TrainingObserver, totals: RunTotals) -> None:
        """The end of training: exchange the partial last round, so every device ends equal."""
        if self.steps_in_round > 0:
            self.end_round(observer, totals)
        self.drain(observer, totals)

    def abandon(self, timeout_seconds: float = 120.0) -> None:
        """A collective failed: let the exchange in flight end (it fails too) before a restart."""
        pending, self.pending = self.pending, None
        if pending is not None:
            try:
                pending.future.exception(timeout=timeout_seconds)
            except Exception:  # the ring is broken; its error is not news
                pass

    # ------------------------------------------------------------------ round pieces
    def _contribution(self) -> Contribution:
        if self.interval.by_time:
            weight = self.samples_in_round / self.nominal_batch_size
        else:
            weight = self.sample_weight
        return Contribution(
            weight=tf.constant(weight, tf.float32),
            own_samples=tf.constant(float(self.samples_in_round), tf.float64),
            known_total_samples=tf.constant(
                float(self.steps_in_round * self.global_batch_size), tf.float64
            ),
            index=tf.constant(self.ledger.submitted, tf.int64),
        )

    def _wait(self, pending: PendingRound) -> tuple[float, RoundResult]:
        started = time.perf_counter()
        result = pending.future.result()
        waited = time.perf_counter() - started
        self.totals.background_seconds += float(result.phase_seconds.numpy().sum())
        return waited, result

    def _applied(self, index: int, result: RoundResult) -> None:
        self.ledger.apply(index)
        self.totals.rounds += 1
        self.totals.skipped_rounds += int(bool(result.nonfinite))

    def _report(
        self,
        observer: TrainingObserver,
        totals: RunTotals,
        seconds: dict[str, float],
        applied: RoundResult | None,
    ) -> float:
        """Add the loop's time at this round end to the phases, its bytes to the totals.

        `seconds`: the graph-timed phases (the outer step and restart are `apply`), and with
        overlap the wait for the round in flight as `exchange`. Returns that time.
        """
        phases = dict.fromkeys(PHASES, 0.0)
        phases.update(seconds)
        seconds_here = sum(phases.values())
        self.totals.sync_seconds += seconds_here
        if applied is not None and self.totals.first_round_sync_seconds is None:
            self.totals.first_round_sync_seconds = seconds_here
        for name, value in phases.items():
            totals.phase_seconds[name] += value
        wire_bytes = raw_bytes = 0
        if applied is not None:
            wire_bytes = int(applied.wire_bytes)
            raw_bytes = self.graph.raw_bytes_per_round
        totals.gradient_bytes_raw += raw_bytes
        totals.gradient_bytes_wire += wire_bytes
        observer.observe_round(
            phases,
            raw_bytes,
            wire_bytes,
            rounds=int(applied is not None),
            skipped=applied is not None and bool(applied.nonfinite),
        )
        return seconds_here

    # ------------------------------------------------------------------ reporting
    def summary(self) -> dict[str, Any]:
        """The rounds-specific fields of the run summary (this device's view)."""
        return {
            "overlap": self.overlap,
            "outer_optimizer": serialize(self.graph.outer),
            "inner_optimizer_state": "local",
            "rounds": self.totals.rounds,
            "skipped_rounds": self.totals.skipped_rounds,
            "rounds_applied_in_order": self.ledger.applied == list(range(self.ledger.submitted)),
            "sync_seconds": self.totals.sync_seconds,
            "first_round_sync_seconds": self.totals.first_round_sync_seconds,
            "background_exchange_seconds": self.totals.background_seconds,
            "round_local_seconds": [round(value, 6) for value in self.totals.round_local_seconds],
            "round_sync_seconds": [round(value, 6) for value in self.totals.round_sync_seconds],
        }


def build_round_engine(trainer: Trainer) -> RoundEngine:
    """The round engine of a trainer whose settings ask for rounds (`--sync-every` > 1)."""
    settings = trainer.settings
    momentum = outer_momentum(settings.outer_optimizer, settings.outer_momentum)
    outer = outer_optimizers.get(
        {
            "class_name": settings.outer_optimizer,
            "config": {"learning_rate": settings.outer_lr, "momentum": momentum},
        }
    )
    graph = RoundGraph(
        model=trainer.model,
        variables=trainer.variables,
        optimizer_variables=optimizer_variables(trainer.optimizer),
        outer=outer,
        compressor=trainer.compressor,
        exchange=trainer.exchange,
        num_ranks=trainer.size,
        rescale_by_samples=settings.sync_interval.by_time,
        nominal_batch_size=settings.batch_size,
    )
    return RoundEngine(
        graph,
        interval=settings.sync_interval,
        overlap=settings.overlap,
        batch_size=trainer.batch_size,
        global_batch_size=trainer.global_batch_size,
        sample_weight=gradient_weight(trainer.rank_batch_sizes, trainer.rank),
        nominal_batch_size=settings.batch_size,
    )
