"""The global weights and the TensorFlow functions that move a device between them and its own.

`RoundGraph` owns the variables every device shares (the global weights, called the anchor,
the outer optimizer's state, the round counters) and each device's round start, and builds
the round's work as few `tf.function` calls as possible, because every call from Python
costs the training loop time it could spend computing:

- `sync_round`: the whole round end, without overlap (delta, exchange, outer step, restart);
- `exchange_round`: compress, exchange, decompress; run on the background thread (overlap);
- `turn` / `first_turn`: apply the previous round's result, take this round's delta and
  restart beside it (overlap); `drain`: apply a result and keep the progress since.

Each returns the seconds it took, timed inside the graph like the step's phases (so the
first call's tracing and graph optimisation are left out, as they are for steps). The protocol
around them (when a round ends, what is in flight) is `engine.RoundEngine`'s.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import NamedTuple

import tensorflow as tf
import tf_keras as keras

from globaldl.compression import GradientCompressor
from globaldl.compression.state import StateUpdate
from globaldl.exchange import Exchange
from globaldl.local_sgd.outer import OuterOptimizer
from globaldl.step import phase_boundary


class RoundResult(NamedTuple):
    """What a round's exchange hands back (tensors; a NamedTuple crosses tf.function)."""

    averaged: list[tf.Tensor]  # the fleet's sample-weighted mean delta, per variable
    nonfinite: tf.Tensor  # some device sent a non-finite delta: every device skips the round
    update: StateUpdate  # new residuals and shared codec state, kept unless the round is skipped
    wire_bytes: tf.Tensor  # int64: bytes this device handed to the round's collectives
    total_samples: tf.Tensor  # float64: examples the whole fleet processed in the round
    statistics: tf.Tensor  # float32: the fleet's mean of the non-trainable floats, flat
    phase_seconds: tf.Tensor  # float64 [3]: compress, exchange, decompress


class Turn(NamedTuple):
    """What an overlapped round end hands to the background exchange, and its seconds."""

    deltas: list[tf.Tensor]  # this device's round delta, per variable
    statistics: tf.Tensor  # this device's non-trainable floats, flat
    seconds: tf.Tensor  # float64: the turn's own time, inside the graph


class Contribution(NamedTuple):
    """How this device's delta enters the average (see `engine`), as tensors."""

    weight: tf.Tensor  # float32: the factor on the delta before compression
    own_samples: tf.Tensor  # float64: examples this device processed in the round
    known_total_samples: tf.Tensor  # float64: the fleet's, when known without asking (steps)
    index: tf.Tensor  # int64: the round's index (seeds the codecs' random draws)


class RoundGraph:
    """The shared round state and the graph functions of a round's end."""

    def __init__(
        self,
        *,
        model: keras.Model,
        variables: list[tf.Variable],
        optimizer_variables: list[tf.Variable],
        outer: OuterOptimizer,
        compressor: GradientCompressor,
        exchange: Exchange,
        num_ranks: int,
        rescale_by_samples: bool,
        nominal_batch_size: int,
    ) -> None:
        self.variables = list(variables)
        self.outer = outer
        self.compressor = compressor
        self.exchange = exchange
        self.num_ranks = num_ranks
        self.rescale_by_samples = rescale_by_samples
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
        # A second, small collective only when something besides the payload must travel.
        self.counts_travel = rescale_by_samples or bool(self.statistics)

    # ------------------------------------------------------------------ eager state moves
    def shared_variables(self) -> list[tf.Variable]:
        """Identical on every device: the global weights, the outer state, the counters."""
        return [*self.anchor, *self.outer.variables, self.rounds, self.skipped_rounds, self.samples]

    def start_from_weights(self) -> None:
        """The device's weights become the global weights and the round's start."""
        _assign(self.anchor, self.variables)
        _assign(self.round_start, self.variables)

    def start_from_anchor(self, weights_too: bool) -> None:
        """The round starts at the global weights (and so do the weights, if asked)."""
        if weights_too:
            _assign(self.variables, self.anchor)
        _assign(self.round_start, self.anchor)

    @contextmanager
    def global_weights(self) -> Iterator[None]:
        """The model holds the global weights inside the block, then its own again."""
        own = [variable.read_value() for variable in self.variables]
        _assign(self.variables, self.anchor)
        try:
            yield
        finally:
            for variable, value in zip(self.variables, own, strict=True):
                variable.assign(value)

    @property
    def raw_bytes_per_round(self) -> int:
        """Bytes one device would send per round if everything went dense in fp32."""
        counts = 8 * (1 + sum(s.shape.num_elements() for s in self.statistics))
        return self.compressor.raw_bytes_per_step + (counts if self.counts_travel else 0)

    # ------------------------------------------------------------------ graph functions
    @tf.function(autograph=False)
    def sync_round(self, contribution: Contribution) -> tuple[RoundResult, tf.Tensor]:
        """A whole round end without overlap: exchange the delta, step, restart at the anchor.

        Returns the exchange's result and the seconds of the outer step and restart.
        """
        deltas, own_finite, statistics = self._take_delta()
        result = self._exchange(deltas, contribution, statistics)
        with tf.control_dependencies(tf.nest.flatten(result)):
            started = tf.timestamp()
        with tf.control_dependencies([started]):
            self._apply(result)
            self._restart(own_finite, in_flight=None)
        return result, self._seconds_since(started)

    @tf.function(autograph=False)
    def exchange_round(
        self, deltas: list[tf.Tensor], contribution: Contribution, statistics: tf.Tensor
    ) -> RoundResult:
        """Compress, exchange and decompress one round's delta (overlap: in the background)."""
        return self._exchange(deltas, contribution, statistics)

    @tf.function(autograph=False)
    def first_turn(self) -> Turn:
        """Overlap, nothing in flight yet: take the delta, restart beside it."""
        started = tf.timestamp()
        with tf.control_dependencies([started]):
            deltas, own_finite, statistics = self._take_delta()
            self._restart(own_finite, in_flight=deltas)
        return Turn(deltas, statistics, self._seconds_since(started))

    @tf.function(autograph=False)
    def turn(self, previous: RoundResult) -> Turn:
        """Overlap: take this round's delta, apply the previous round, restart beside it."""
        started = tf.timestamp()
        with tf.control_dependencies([started]):
            deltas, own_finite, statistics = self._take_delta()
            self._apply(previous)
            self._restart(own_finite, in_flight=deltas)
        return Turn(deltas, statistics, self._seconds_since(started))

    @tf.function(autograph=False)
    def drain(self, previous: RoundResult) -> tf.Tensor:
        """Apply the round in flight; keep the progress made since on top of the new anchor."""
        started = tf.timestamp()
        with tf.control_dependencies([started]):
            self._apply(previous)
            for variable, start, anchor in zip(
                self.variables, self.round_start, self.anchor, strict=True
            ):
                variable.assign(anchor + (variable - start))
                start.assign(anchor)
        return self._seconds_since(started)

    # ------------------------------------------------------------------ ops (traced inside)
    def _seconds_since(self, started: tf.Tensor) -> tf.Tensor:
        """Seconds from `started` to after every write of the round (the reads wait for them)."""
        written = [
            v.read_value()
            for v in [
                *self.variables,
                *self.round_start,
                *self.shared_variables(),
                *self.compressor.step_state_variables,
                *self.optimizer_slots,
                *self.statistics,
            ]
        ]
        with tf.control_dependencies(written):
            return tf.timestamp() - started

    def _take_delta(self) -> tuple[list[tf.Tensor], tf.Tensor, tf.Tensor]:
        deltas = [
            start - variable
            for start, variable in zip(self.round_start, self.variables, strict=True)
        ]
        finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(d)) for d in deltas])
        pieces = [tf.reshape(v, [-1]) for v in self.statistics]
        statistics = tf.concat(pieces, axis=0) if pieces else tf.zeros([0], tf.float32)
        return deltas, finite, statistics

    def _exchange(
        self, deltas: list[tf.Tensor], contribution: Contribution, statistics: tf.Tensor
    ) -> RoundResult:
        compressor, exchange = self.compressor, self.exchange
        start = tf.timestamp()
        with tf.control_dependencies([start]):
            weighted = [delta * contribution.weight for delta in deltas]
        payload, update = compressor.compress(weighted, contribution.index)
        (payload, update), compressed = phase_boundary((payload, update))

        # The codec's declaration decides the collectives, as in the per-step exchange; a codec
        # of several rounds (PowerSGD) computes each round's payload from the last one's sum.
        spec = compressor.wire_spec
        sent = exchange.exchange_payload(payload, spec)
        wire_bytes = sent.wire_bytes
        for round_index in range(1, spec.rounds):
            payload, update = compressor.next_round(
                round_index, sent.payload, self.num_ranks, update
            )
            sent = exchange.exchange_payload(payload, spec, round_index)
            wire_bytes += sent.wire_bytes
        if self.counts_travel:
            own = tf.reshape(contribution.own_samples, [1])
            counts = tf.concat([own, tf.cast(statistics, tf.float64)], axis=0)
            counts = exchange.sum_across_ranks(counts, "round_counts")
            wire_bytes += 8 * tf.size(counts, out_type=tf.int64)
        else:
            counts = tf.reshape(contribution.known_total_samples, [1])
        (received, lengths, wire_bytes, counts, update), exchanged = phase_boundary(
            (sent.payload, sent.lengths, wire_bytes, counts, update)
        )

        # The update comes back with the shared state this exchange decided (scales, score,
        # basis); like the residuals, it is applied only when the round is not skipped.
        averaged, nonfinite, decided = compressor.decompress_update(
            received, lengths, self.num_ranks, update
        )
        # The carry (positions, PowerSGD's factors) served this round only: it stays out of
        # the result, whose shapes must not vary from round to round (the overlapped turn).
        update = StateUpdate((decided or update).values)
        total_samples = counts[0]
        if self.rescale_by_samples:
            # Each device sent samples_i / nominal_batch x its delta: rescale to the mean.
            scale = self.nominal_batch_size * self.num_ranks / tf.maximum(total_samples, 1.0)
            averaged = [value * tf.cast(scale, tf.float32) for value in averaged]
        statistics_mean = tf.cast(counts[1:] / self.num_ranks, tf.float32)
        (averaged, nonfinite, statistics_mean, update), decompressed = phase_boundary(
            (averaged, nonfinite, statistics_mean, update)
        )
        phase_seconds = tf.stack(
            [compressed - start, exchanged - compressed, decompressed - exchanged]
        )
        return RoundResult(
            averaged, nonfinite, update, wire_bytes, total_samples, statistics_mean, phase_seconds
        )

    def _apply(self, result: RoundResult) -> None:
        """The outer step and the residuals, unless some device's delta was not finite."""

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

    def _restart(self, own_finite: tf.Tensor, in_flight: list[tf.Tensor] | None) -> None:
        """The next round starts at the anchor, plus this device's delta still in flight.

        A device whose own delta was not finite drops it and zeroes its non-finite inner
        optimizer slots: it restarts clean from the global weights.
        """
        for index, (variable, start, anchor) in enumerate(
            zip(self.variables, self.round_start, self.anchor, strict=True)
        ):
            restart = anchor if in_flight is None else anchor - in_flight[index]
            restart = tf.where(own_finite, restart, anchor)
            variable.assign(restart)
            start.assign(restart)
        for slot in self.optimizer_slots:
            slot.assign(tf.where(own_finite | tf.math.is_finite(slot), slot, tf.zeros_like(slot)))


def _assign(targets: list[tf.Variable], sources: list[tf.Variable]) -> None:
    for target, source in zip(targets, sources, strict=True):
        target.assign(source)
