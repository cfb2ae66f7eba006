"""Step 1's choice of positions, tensor by tensor, for the gathered and the summed payloads."""

from __future__ import annotations

import tensorflow as tf

from globaldl.compression.layout import FlatLayout
from globaldl.compression.sparsifier import EXCLUDED, Sparsifier, kept_count


def fold_seed(seed: tf.Tensor, salt: int) -> tf.Tensor:
    """A new stateless seed derived from ``seed`` and ``salt``."""
    return tf.random.experimental.stateless_fold_in(seed, salt)


def select_positions(
    sparsifier: Sparsifier,
    layout: FlatLayout,
    basis: tf.Tensor,
    keep: tf.Tensor | None,
    density: float | tf.Tensor,
    seed: tf.Tensor,
) -> tf.Tensor:
    """Ascending int32 flat positions to send from the pruned part of the layout.

    ``basis`` is what the sparsifier ranks (float32 [N] or the pruned part of it): this
    rank's accumulated gradient, or a score every rank shares. Entries whose weights are
    pruned (``keep`` False) are never chosen. Each tensor keeps ``kept_count`` entries.
    """
    if not layout.sparse_infos:
        return tf.zeros([0], tf.int32)
    magnitudes = tf.abs(basis[: layout.sparse_elements])
    if keep is not None:
        magnitudes = tf.where(keep[: layout.sparse_elements], magnitudes, EXCLUDED)
    pieces = []
    for info in layout.sparse_infos:
        num_kept = kept_count(info.size, density, layout.caps[info.index])
        indices = sparsifier.select(
            magnitudes[info.offset : info.offset + info.size],
            num_kept,
            fold_seed(seed, info.index),
        )
        pieces.append(tf.cast(indices, tf.int32) + info.offset)
    return tf.concat(pieces, axis=0)
