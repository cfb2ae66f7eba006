"""Random-k sparsifier: send k entries chosen uniformly at random."""

from __future__ import annotations

import tensorflow as tf

from globaldl.compression.sparsifier import EXCLUDED, SPARSIFIERS, Sparsifier


@SPARSIFIERS.register
class RandomK(Sparsifier):
    """Keeps exactly ``num_kept`` distinct entries drawn uniformly (never an excluded one).

    The draw is stateless: it depends on the configured seed, the rank and the step only.
    Values are sent unscaled (not multiplied by n / k), so without error feedback the sent
    gradient is a biased (shrunk) estimate; with error feedback, the default, nothing is lost.
    """

    name = "randomk"

    def select(self, magnitudes, num_kept, seed):  # noqa: D102
        priority = tf.random.stateless_uniform(tf.shape(magnitudes), seed)
        priority = tf.where(magnitudes == EXCLUDED, -1.0, priority)
        return tf.sort(tf.math.top_k(priority, num_kept, sorted=False).indices)
