"""One training step as one `tf.function`: load, compute, compress, exchange, decompress, apply.

How the phases are timed. Between phases, `phase_boundary` takes a `tf.timestamp()` that
depends (by control edges) on every tensor the phase produced, and hands the next phase
identity copies of those tensors that depend on the timestamp. So a phase cannot start before
the previous one has finished, and each timestamp is taken exactly when its phase ends. The
cost is six timestamp ops and a few identity ops per step, and the loss of overlap between
phases (`globaldl bench timing`: 0.38 ms, 5.6%, on a 6.8 ms LeNet step), which on CPU-only
devices the runtime could barely exploit anyway: gradients must exist before they are
compressed, and the collective must finish before anything is applied. The step returns its
six durations with the loss in one small tensor, the only per-step transfer to Python.

Every `tf.function` here and in the round graphs is traced without autograph: their control
flow is TensorFlow's own (`tf.cond`, `tf.where`), so autograph's rewrite of every function the
step calls bought nothing and cost start-up (`globaldl train --model lenet --dataset mnist
--epochs 1 --max-steps-per-epoch 2`, whole process: 8.8 s against 10.6 s, median of 5
interleaved runs, 2026-12-06). A Python `if` on a tensor then fails at trace time, loudly.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import tensorflow as tf
import tf_keras as keras

from globaldl.compression import GradientCompressor
from globaldl.exchange import Exchange
from globaldl.monitoring import PHASES

# Layout of the vector one training step returns: the phase durations, then these.
LOSS, CORRECT, WIRE_BYTES, SKIPPED = range(len(PHASES), len(PHASES) + 4)


@dataclass(frozen=True)
class StepParts:
    """Everything the step closes over: built once by the trainer, read at trace time."""

    model: keras.Model
    variables: list[tf.Variable]
    loss_fn: keras.losses.Loss
    optimizer: keras.optimizers.Optimizer
    compressor: GradientCompressor
    exchange: Exchange
    step: tf.Variable  # the global step, advanced by every step (also a skipped one)
    num_ranks: int
    rank: int
    gradient_weight: float  # 1, or this rank's share of an unequal global batch
    inject_nan_step: int | None = None
    inject_nan_rank: int = 0


def phase_boundary(tensors: Any) -> tuple[Any, tf.Tensor]:
    """Timestamp the end of a phase; return its outputs gated on that timestamp."""
    with tf.control_dependencies(tf.nest.flatten(tensors)):
        stamp = tf.timestamp()
    with tf.control_dependencies([stamp]):
        gated = tf.nest.map_structure(tf.identity, tensors)
    return gated, stamp


def no_boundary(tensors: Any) -> tuple[Any, tf.Tensor]:
    """The same step without phase timing (for measuring what the timing costs)."""
    return tensors, tf.constant(0.0, tf.float64)


def forward_backward(
    parts: StepParts, images: tf.Tensor, labels: tf.Tensor
) -> tuple[list[tf.Tensor | None], tf.Tensor, tf.Tensor]:
    """The compute phase: gradients (masked, weighted, maybe poisoned), loss, correct count."""
    model, variables = parts.model, parts.variables
    with tf.GradientTape() as tape:
        logits = model(images, training=True)
        loss = parts.loss_fn(labels, logits)
        if model.losses:
            loss += tf.add_n(model.losses)
    gradients = parts.compressor.mask_gradients(tape.gradient(loss, variables))
    weight = parts.gradient_weight
    if weight != 1.0:
        # Unequal local batches: weight by sample count so the average stays the mean.
        gradients = [None if g is None else g * weight for g in gradients]
    if parts.inject_nan_step is not None:
        poisoned = tf.logical_and(
            tf.equal(parts.step, parts.inject_nan_step),
            tf.constant(parts.rank == parts.inject_nan_rank),
        )
        gradients[0] = gradients[0] + tf.where(poisoned, float("nan"), 0.0)
    correct = tf.reduce_sum(
        tf.cast(tf.equal(tf.argmax(logits, -1, output_type=tf.int32), labels), tf.float64)
    )
    return gradients, loss, correct


def build_train_step(parts: StepParts, phase_timing: bool = True) -> Callable[[Any], tf.Tensor]:
    """The training step: takes an iterator, returns phase seconds, loss, correct, bytes, skip."""
    compressor, exchange = parts.compressor, parts.exchange
    variables, optimizer, step = parts.variables, parts.optimizer, parts.step
    num_ranks = tf.constant(parts.num_ranks, tf.int32)
    boundary = phase_boundary if phase_timing else no_boundary

    @tf.function(autograph=False)
    def train_step(iterator: Any) -> tf.Tensor:
        start = tf.timestamp() if phase_timing else tf.constant(0.0, tf.float64)
        with tf.control_dependencies([start]):
            images, labels = next(iterator)
        (images, labels), loaded = boundary((images, labels))

        gradients, loss, correct = forward_backward(parts, images, labels)
        (gradients, loss, correct), computed = boundary((gradients, loss, correct))

        payload, update = compressor.compress(gradients, step.read_value())
        (payload, update), compressed = boundary((payload, update))

        spec = compressor.wire_spec
        sent = exchange.exchange_payload(payload, spec)
        wire_bytes = sent.wire_bytes
        # A codec of several rounds (PowerSGD) computes each round's payload from the last
        # round's result; that work is part of the exchange phase.
        for round_index in range(1, spec.rounds):
            payload, update = compressor.next_round(round_index, sent.payload, num_ranks, update)
            sent = exchange.exchange_payload(payload, spec, round_index)
            wire_bytes += sent.wire_bytes
        (received, lengths, wire_bytes, update), exchanged = boundary(
            (sent.payload, sent.lengths, wire_bytes, update)
        )

        averaged, nonfinite, update = compressor.decompress_update(
            received, lengths, num_ranks, update
        )
        (averaged, nonfinite, update), decompressed = boundary((averaged, nonfinite, update))

        def apply() -> tf.Tensor:
            optimizer.apply_gradients(zip(averaged, variables, strict=True))
            compressor.apply_state(update)
            compressor.apply_weight_masks()
            compressor.update_weight_masks(step.read_value())
            return tf.constant(0.0, tf.float64)

        # Every rank sees every rank's nonfinite flag in the exchanged payload, so all
        # ranks take the same branch: skip the step, leave weights and residuals untouched.
        skipped = tf.cond(nonfinite, lambda: tf.constant(1.0, tf.float64), apply)
        with tf.control_dependencies([skipped]):
            advanced = step.assign_add(1)
        (skipped, _), applied = boundary((skipped, advanced))

        stamps = tf.stack([start, loaded, computed, compressed, exchanged, decompressed, applied])
        phase_seconds = stamps[1:] - stamps[:-1]
        extras = tf.stack(
            [tf.cast(loss, tf.float64), correct, tf.cast(wire_bytes, tf.float64), skipped]
        )
        return tf.concat([phase_seconds, extras], axis=0)

    return train_step
