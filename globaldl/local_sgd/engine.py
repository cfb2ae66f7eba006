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
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import tensorflow as tf
import tf_keras as keras

from globaldl.compression import GradientCompressor
from globaldl.compression.compressor import StateUpdate
from globaldl.exchange import Exchange
from globaldl.local_sgd.outer import OuterOptimizer, serialize
from globaldl.local_sgd.overlap import PendingRound, RoundLedger, run_in_background
from globaldl.local_sgd.schedule import SyncInterval
from globaldl.monitoring import PHASES, TrainingObserver
from globaldl.step import phase_boundary

if TYPE_CHECKING:  # the trainer imports this module
    from globaldl.trainer import RunTotals

SYNC_PHASES = ("compress", "exchange", "decompress", "apply")


class RoundResult(NamedTuple):
    """What a round's exchange hands back (tensors; a NamedTuple crosses tf.function)."""

    averaged: list[tf.Tensor]  # the fleet's sample-weighted mean delta, per variable
    nonfinite: tf.Tensor  # some device sent a non-finite delta: every device skips the round
    update: StateUpdate  # this device's new residuals, kept unless the round is skipped
    wire_bytes: tf.Tensor  # int64: bytes this device handed to the round's collectives
    total_samples: tf.Tensor  # float64: examples the whole fleet processed in the round
    statistics: tf.Tensor  # float32: the fleet's mean of the non-trainable floats, flat
    phase_seconds: tf.Tensor  # float64 [3]: compress, exchange, decompress


@dataclass
class RoundTotals:
    """What this device adds up over its rounds, for the summary."""

    rounds: int = 0
    skipped_rounds: int = 0
    sync_seconds: float = 0.0  # the training loop's own time at round ends (waits included)
    tracing_seconds: float = 0.0  # first calls of the round's tf.functions (once per run)
    background_seconds: float = 0.0  # exchanges that ran beside the local steps (overlap)


class RoundEngine:
    """Holds the global weights and the outer state; ends rounds, overlapped or not."""

    def __init__(
        self,
        *,
        interval: SyncInterval,
        overlap: bool,
        outer: OuterOptimizer,
        model: keras.Model,
        variables: list[tf.Variable],
        optimizer: keras.optimizers.Optimizer,
        optimizer_variables: list[tf.Variable],
        compressor: GradientCompressor,
        exchange: Exchange,
        num_ranks: int,
        batch_size: int,
        global_batch_size: int,
        sample_weight: float,
        nominal_batch_size: int,
    ) -> None:
        if interval.per_step:
            raise ValueError("a RoundEngine needs sync_every > 1 (1 is the per-step exchange)")
        self.interval = interval
        self.overlap = overlap
        self.outer = outer
        self.model = model
        self.variables = list(variables)
        self.compressor = compressor
        self.exchange = exchange
        self.num_ranks = num_ranks
        self.batch_size = batch_size
        self.global_batch_size = global_batch_size
        self.sample_weight = sample_weight
        self.nominal_batch_size = nominal_batch_size
        self.optimizer_slots = [v for v in optimizer_variables if v.dtype.is_floating]
        self.statistics = [v for v in model.non_trainable_variables if v.dtype.is_floating]
        self.anchor = [
            tf.Variable(v.read_value(), trainable=False, name="round_anchor") for v in variables
        ]
        self.round_start = [
            tf.Variable(v.read_value(), trainable=False, name="round_start") for v in variables
        ]
        outer.build(self.anchor)
        self.rounds = tf.Variable(0, dtype=tf.int64, trainable=False, name="rounds")
        self.skipped_rounds = tf.Variable(0, dtype=tf.int64, trainable=False, name="skipped")
        self.samples = tf.Variable(0.0, dtype=tf.float64, trainable=False, name="round_samples")
        # A second small collective only when something beyond the payload must travel.
        self._counts_travel = interval.by_time or bool(self.statistics)
        self.ledger = RoundLedger()
        self.totals = RoundTotals()
        self.pending: PendingRound | None = None
        self.steps_in_round = 0
        self.samples_in_round = 0
        self.round_started = time.perf_counter()
        self._traced: set[str] = set()
        self._tracing_now = 0.0

    # ------------------------------------------------------------------ state
    def shared_variables(self) -> list[tf.Variable]:
        """Identical on every device: the global weights, the outer state, the counters."""
        return [*self.anchor, *self.outer.variables, self.rounds, self.skipped_rounds, self.samples]

    def checkpoint(self) -> tf.train.Checkpoint:
        """The shared part as a checkpoint object (rank 0 writes it)."""
        return tf.train.Checkpoint(
            **{f"shared_{index}": v for index, v in enumerate(self.shared_variables())}
        )

    def start(self) -> None:
        """A fresh run: the broadcast initial weights become the global weights."""
        self._assign(self.anchor, self.variables)
        self._assign(self.round_start, self.variables)
        self.restart_bookkeeping(step=0)

    def after_restore(self, step: int, own_state_found: bool) -> None:
        """Continue from a checkpoint or an elastic commit: no exchange in flight.

        Every checkpoint and commit is taken with nothing in flight, where the round started
        from the anchor. A device without its own saved weights restarts its round from the
        anchor (its unsaved local progress is lost).
        """
        if not own_state_found:
            self._assign(self.variables, self.anchor)
        self._assign(self.round_start, self.anchor)
        self.restart_bookkeeping(step)

    def restart_bookkeeping(self, step: int) -> None:
        """Python-side counters from the variables: rounds done, steps into this round."""
        self.pending = None
        self.ledger.restart_at(int(self.rounds.numpy()))
        # Rounds by steps are cut every H global steps from step 0 (a partial last round is
        # exchanged only when training ends, after its checkpoint), so the position follows.
        self.steps_in_round = 0 if self.interval.by_time else step % int(self.interval.steps or 1)
        self.samples_in_round = self.steps_in_round * self.batch_size
        self.round_started = time.perf_counter()

    @staticmethod
    def _assign(targets: list[tf.Variable], sources: list[tf.Variable]) -> None:
        for target, source in zip(targets, sources, strict=True):
            target.assign(source)

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
        started = time.perf_counter()
        self._tracing_now = 0.0
        self._trace(self._take_delta)
        deltas, own_finite, statistics = self._take_delta()
        if self.interval.by_time:
            weight = self.samples_in_round / self.nominal_batch_size
        else:
            weight = self.sample_weight
        arguments = (
            deltas,
            tf.constant(weight, tf.float32),
            tf.constant(float(self.samples_in_round), tf.float64),
            tf.constant(float(self.steps_in_round * self.global_batch_size), tf.float64),
            tf.constant(self.ledger.submitted, tf.int64),
            statistics,
        )
        index = self.ledger.submit()
        # Traced here, in the loop's thread, and kept out of the sync time (the per-step
        # exchange's timestamps exclude its tracing too).
        self._trace(self._exchange_round, *arguments)
        if not self.overlap:
            result = self._exchange_round(*arguments)
            seconds = dict(zip(SYNC_PHASES[:3], result.phase_seconds.numpy().tolist(), strict=True))
            applied = self._apply(index, result)
            self._trace(self._restart_at_anchor, own_finite)
            self._restart_at_anchor(own_finite)
        else:
            waited, applied = 0.0, None
            if self.pending is not None:
                waited, applied = self._wait_and_apply(self.pending)
            future = run_in_background(self._exchange_round, *arguments)
            self.pending = PendingRound(index, future, deltas, own_finite)
            self._trace(self._restart_beside, deltas, own_finite)
            self._restart_beside(deltas, own_finite)
            seconds = {"exchange": waited}
        self._report(observer, totals, started, seconds, applied)
        self.steps_in_round = 0
        self.samples_in_round = 0
        self.round_started = time.perf_counter()

    def drain(self, observer: TrainingObserver, totals: RunTotals) -> None:
        """Wait for the round in flight and apply it; keep this round's progress on top.

        Called at epoch ends and before commits, so that validation sees every finished round
        and checkpoints hold nothing in flight. Without overlap there is nothing to do.
        """
        if self.pending is None:
            return
        started = time.perf_counter()
        self._tracing_now = 0.0
        waited, applied = self._wait_and_apply(self.pending)
        self.pending = None
        self._trace(self._rebase_on_anchor)
        self._rebase_on_anchor()
        self._report(observer, totals, started, {"exchange": waited}, applied)

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
            except Exception:  # noqa: S110 - the ring is broken; its error is not news
                pass

    @contextmanager
    def global_weights(self) -> Iterator[None]:
        """The model holds the global weights inside the block (for validation), then its own."""
        own = [variable.read_value() for variable in self.variables]
        self._assign(self.variables, self.anchor)
        try:
            yield
        finally:
            for variable, value in zip(self.variables, own, strict=True):
                variable.assign(value)

    # ------------------------------------------------------------------ round pieces
    def _wait_and_apply(self, pending: PendingRound) -> tuple[float, Any]:
        started = time.perf_counter()
        result = pending.future.result()
        waited = time.perf_counter() - started
        self.totals.background_seconds += float(tf.reduce_sum(result.phase_seconds))
        return waited, self._apply(pending.index, result)

    def _trace(self, function: Any, *arguments: Any) -> None:
        """Trace a round function before its first call, timing the tracing apart."""
        name = function.__name__
        if name in self._traced:
            return
        started = time.perf_counter()
        function.get_concrete_function(*arguments)
        seconds = time.perf_counter() - started
        self._traced.add(name)
        self._tracing_now += seconds
        self.totals.tracing_seconds += seconds

    def _apply(self, index: int, result: RoundResult) -> RoundResult:
        self.ledger.apply(index)
        self._trace(self._apply_round, result)
        skipped = bool(self._apply_round(result))
        self.totals.rounds += 1
        self.totals.skipped_rounds += int(skipped)
        return result

    def _report(
        self,
        observer: TrainingObserver,
        totals: RunTotals,
        started: float,
        seconds: dict[str, float],
        applied: RoundResult | None,
    ) -> None:
        """Add the loop's time at this round end to the phases (the rest of it is `apply`)."""
        elapsed = time.perf_counter() - started - self._tracing_now
        phases = dict.fromkeys(PHASES, 0.0)
        phases.update(seconds)
        phases["apply"] = max(0.0, elapsed - sum(seconds.values()))
        self.totals.sync_seconds += elapsed
        for name, value in phases.items():
            totals.phase_seconds[name] += value
        wire_bytes = raw_bytes = 0
        skipped = False
        if applied is not None:
            wire_bytes = int(applied.wire_bytes)
            raw_bytes = self.raw_bytes_per_round
            skipped = bool(applied.nonfinite)
        totals.gradient_bytes_raw += raw_bytes
        totals.gradient_bytes_wire += wire_bytes
        observer.observe_round(
            phases, raw_bytes, wire_bytes, rounds=int(applied is not None), skipped=skipped
        )

    @property
    def raw_bytes_per_round(self) -> int:
        """Bytes one device would send per round if everything went dense in fp32."""
        counts = 8 * (1 + sum(s.shape.num_elements() for s in self.statistics))
        return self.compressor.raw_bytes_per_step + (counts if self._counts_travel else 0)

    @tf.function
    def _take_delta(self) -> tuple[list[tf.Tensor], tf.Tensor, tf.Tensor]:
        deltas = [
            start - variable
            for start, variable in zip(self.round_start, self.variables, strict=True)
        ]
        finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(d)) for d in deltas])
        pieces = [tf.reshape(v, [-1]) for v in self.statistics]
        statistics = tf.concat(pieces, axis=0) if pieces else tf.zeros([0], tf.float32)
        return deltas, finite, statistics

    @tf.function
    def _exchange_round(
        self,
        deltas: list[tf.Tensor],
        weight: tf.Tensor,
        own_samples: tf.Tensor,
        known_total_samples: tf.Tensor,
        index: tf.Tensor,
        statistics: tf.Tensor,
    ) -> RoundResult:
        compressor, exchange = self.compressor, self.exchange
        start = tf.timestamp()
        with tf.control_dependencies([start]):
            weighted = [delta * weight for delta in deltas]
        payload, update = compressor.compress(weighted, index)
        (payload, update), compressed = phase_boundary((payload, update))

        sent = exchange.exchange_payload(payload, compressor)
        wire_bytes = sent.wire_bytes
        if self._counts_travel:
            counts = tf.concat([tf.reshape(own_samples, [1]), tf.cast(statistics, tf.float64)], 0)
            counts = exchange.sum_across_ranks(counts, "round_counts")
            wire_bytes += 8 * tf.size(counts, out_type=tf.int64)
        else:
            counts = tf.reshape(known_total_samples, [1])
        (received, lengths, wire_bytes, counts), exchanged = phase_boundary(
            (sent.payload, sent.lengths, wire_bytes, counts)
        )

        averaged, nonfinite = compressor.decompress(received, lengths, self.num_ranks)
        total_samples = counts[0]
        if self.interval.by_time:
            # Each device sent samples_i / nominal_batch x its delta: rescale to the mean.
            scale = self.nominal_batch_size * self.num_ranks / tf.maximum(total_samples, 1.0)
            averaged = [value * tf.cast(scale, tf.float32) for value in averaged]
        statistics_mean = tf.cast(counts[1:] / self.num_ranks, tf.float32)
        (averaged, nonfinite, statistics_mean), decompressed = phase_boundary(
            (averaged, nonfinite, statistics_mean)
        )
        phase_seconds = tf.stack(
            [compressed - start, exchanged - compressed, decompressed - exchanged]
        )
        return RoundResult(
            averaged, nonfinite, update, wire_bytes, total_samples, statistics_mean, phase_seconds
        )

    @tf.function
    def _apply_round(self, result: RoundResult) -> tf.Tensor:
        def apply() -> tf.Tensor:
            self.outer.apply(result.averaged, self.anchor)
            self.compressor.apply_state(result.update)
            if self.statistics:
                usable = tf.reduce_all(tf.math.is_finite(result.statistics))
                sizes = [v.shape.num_elements() for v in self.statistics]
                for variable, mean in zip(
                    self.statistics, tf.split(result.statistics, sizes), strict=True
                ):
                    variable.assign(tf.where(usable, tf.reshape(mean, variable.shape), variable))
            return tf.constant(False)

        skipped = tf.cond(result.nonfinite, lambda: tf.constant(True), apply)
        self.rounds.assign_add(1)
        self.skipped_rounds.assign_add(tf.cast(skipped, tf.int64))
        self.samples.assign_add(result.total_samples)
        return skipped

    def _clean_slots(self, own_finite: tf.Tensor) -> None:
        for slot in self.optimizer_slots:
            slot.assign(tf.where(own_finite | tf.math.is_finite(slot), slot, tf.zeros_like(slot)))

    @tf.function
    def _restart_at_anchor(self, own_finite: tf.Tensor) -> None:
        for variable, start, anchor in zip(
            self.variables, self.round_start, self.anchor, strict=True
        ):
            variable.assign(anchor)
            start.assign(anchor)
        self._clean_slots(own_finite)

    @tf.function
    def _restart_beside(self, in_flight: list[tf.Tensor], own_finite: tf.Tensor) -> None:
        for variable, start, anchor, delta in zip(
            self.variables, self.round_start, self.anchor, in_flight, strict=True
        ):
            restart = tf.where(own_finite, anchor - delta, anchor)
            variable.assign(restart)
            start.assign(restart)
        self._clean_slots(own_finite)

    @tf.function
    def _rebase_on_anchor(self) -> None:
        for variable, start, anchor in zip(
            self.variables, self.round_start, self.anchor, strict=True
        ):
            variable.assign(anchor + (variable - start))
            start.assign(anchor)

    # ------------------------------------------------------------------ reporting
    def summary(self) -> dict[str, Any]:
        """The rounds-specific fields of the run summary (this device's view)."""
        return {
            "overlap": self.overlap,
            "outer_optimizer": serialize(self.outer),
            "inner_optimizer_state": "local",
            "rounds": self.totals.rounds,
            "skipped_rounds": self.totals.skipped_rounds,
            "rounds_applied_in_order": self.ledger.applied == list(range(self.ledger.submitted)),
            "sync_seconds": self.totals.sync_seconds,
            "background_exchange_seconds": self.totals.background_seconds,
            "tracing_seconds": self.totals.tracing_seconds,
        }
