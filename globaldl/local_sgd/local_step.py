"""One local step as one `tf.function`: load, compute, apply, with no exchange.

The same phases and the same result vector as `globaldl.step.build_train_step`, so the trainer
reads both alike: compress, exchange and decompress take 0 s and no bytes (a round's exchange
is timed by the round, `globaldl.local_sgd.engine`). A non-finite gradient is applied like any
other: the device's weights turn non-finite, and its round delta carries the flag that makes
every device skip the round. Its loss is left out of the epoch's totals (`SKIPPED` is 1).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tensorflow as tf

from globaldl.step import StepParts, forward_backward, no_boundary, phase_boundary


def build_local_step(parts: StepParts, phase_timing: bool = True) -> Callable[[Any], tf.Tensor]:
    """The local step: takes an iterator, returns phase seconds, loss, correct, 0 bytes, skip."""
    variables, optimizer, step = parts.variables, parts.optimizer, parts.step
    boundary = phase_boundary if phase_timing else no_boundary
    no_time = tf.constant(0.0, tf.float64)

    @tf.function(autograph=False)
    def local_step(iterator: Any) -> tf.Tensor:
        start = tf.timestamp() if phase_timing else no_time
        with tf.control_dependencies([start]):
            images, labels = next(iterator)
        (images, labels), loaded = boundary((images, labels))

        gradients, loss, correct = forward_backward(parts, images, labels)
        (gradients, loss, correct), computed = boundary((gradients, loss, correct))

        updated = optimizer.apply_gradients(zip(gradients, variables, strict=True))
        with tf.control_dependencies([updated]):
            advanced = step.assign_add(1)
        _, applied = boundary(advanced)

        phase_seconds = tf.stack(
            [loaded - start, computed - loaded, no_time, no_time, no_time, applied - computed]
        )
        not_counted = tf.cast(tf.logical_not(tf.math.is_finite(loss)), tf.float64)
        extras = tf.stack([tf.cast(loss, tf.float64), correct, no_time, not_counted])
        return tf.concat([phase_seconds, extras], axis=0)

    return local_step
