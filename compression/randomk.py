"""Random-k sparsifier: send k entries chosen uniformly at random."""

from __future__ import annotations

import math

import tensorflow as tf

from globaldl.compression.sparsifier import EXCLUDED, SPARSIFIERS, Sparsifier

FALLBACK_SALT = 7
MAX_DRAWN_FRACTION = 0.125
"""Above k = size / 8 draws with replacement repeat too often: priorities over all entries."""


def draws_for(size: int, num_kept: int) -> int:
    """Draws with replacement that yield ``num_kept`` distinct entries of ``size`` all but surely.

    About k**2 / (2 size) draws repeat an earlier one; k + k**2 / size + 4 sqrt(k) + 16 leaves
    a margin of more than four standard deviations of that count for k <= size / 8.
    """
    return math.ceil(num_kept + num_kept * num_kept / size + 4 * math.sqrt(num_kept) + 16)


@SPARSIFIERS.register
class RandomK(Sparsifier):
    """Keeps exactly ``num_kept`` distinct entries drawn uniformly (never an excluded one).

    The draw is stateless: it depends on the configured seed, the rank and the step only.
    Values are sent unscaled (not multiplied by n / k), so without error feedback the sent
    gradient is a biased (shrunk) estimate; with error feedback, the default, nothing is lost.

    Cost is proportional to k, not to the tensor: it draws a few more than k positions with
    replacement and keeps the first k distinct allowed ones (the first distinct values of an
    i.i.d. uniform stream come in a uniformly random order, so they are a uniform k-subset).
    When too few come through (weights pruned away, or k above size / 8) it falls back to a
    uniform priority per entry and the top k of those: still exactly k, still uniform.
    """

    name = "randomk"

    def select(self, magnitudes, num_kept, seed):  # noqa: D102
        size = int(magnitudes.shape[0])
        if isinstance(num_kept, tf.Tensor) or not 0 < num_kept <= MAX_DRAWN_FRACTION * size:
            return self._by_priority(magnitudes, num_kept, seed)
        drawn = tf.random.stateless_uniform(
            [draws_for(size, num_kept)], seed, 0, size, dtype=tf.int32
        )
        allowed = tf.boolean_mask(drawn, tf.not_equal(tf.gather(magnitudes, drawn), EXCLUDED))
        distinct, _ = tf.unique(allowed)
        return tf.cond(
            tf.size(distinct) >= num_kept,
            lambda: tf.sort(distinct[:num_kept]),
            lambda: self._by_priority(
                magnitudes, num_kept, tf.random.experimental.stateless_fold_in(seed, FALLBACK_SALT)
            ),
        )

    @staticmethod
    def _by_priority(magnitudes: tf.Tensor, num_kept: int | tf.Tensor, seed: tf.Tensor):
        """The top ``num_kept`` of a uniform priority per allowed entry (cost: the whole tensor)."""
        priority = tf.random.stateless_uniform(tf.shape(magnitudes), seed)
        priority = tf.where(magnitudes == EXCLUDED, -1.0, priority)
        return tf.sort(tf.math.top_k(priority, num_kept, sorted=False).indices)
