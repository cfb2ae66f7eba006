"""Top-k sparsifier: send the k entries of largest magnitude."""

from __future__ import annotations

import tensorflow as tf

from globaldl.compression.sparsifier import SPARSIFIERS, Sparsifier


@SPARSIFIERS.register
class TopK(Sparsifier):
    """Keeps exactly the ``num_kept`` largest magnitudes of each tensor (ties broken by index)."""

    name = "topk"

    def select(self, magnitudes, num_kept, seed):  # noqa: D102
        return tf.sort(tf.math.top_k(magnitudes, num_kept, sorted=False).indices)
