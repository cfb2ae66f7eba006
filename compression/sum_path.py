"""Summed payloads: every rank sends values at the same positions; one allreduce adds them."""

from __future__ import annotations

import tensorflow as tf

from globaldl.compression.gather_path import Encoded
from globaldl.compression.layout import FlatLayout
from globaldl.compression.summable import DecodedSum, SumEncoding


class SumPath:
    """Agreed positions (or everything) + a summable encoding, in one fixed-length vector.

    The payload holds the kept entries of each pruned tensor at the positions every rank
    chose alike, then the dense-sent entries, encoded by the quantizer's
    :class:`SumEncoding`. Receivers decode the one sum and scatter it back into the flat
    layout. Dense-sent weights pruned to zero are left out where the encoding allows a
    length that changes between steps (float sums; the weight masks, hence the length, are
    the same on every rank), and sent as zeros where it needs a static layout (integer lanes).
    """

    def __init__(self, layout: FlatLayout, encoding: SumEncoding) -> None:
        self.layout = layout
        self.encoding = encoding
        self.dtype = encoding.dtype
        self.varies = layout.dense_count_varies and encoding.accepts_variable_length
        self.fixed_bytes: int | None = (
            None if self.varies else encoding.payload_elements * tf.as_dtype(self.dtype).size
        )

    def encode(
        self,
        accumulated: tf.Tensor,
        positions: tf.Tensor,
        keep: tf.Tensor | None,
        nonfinite: tf.Tensor,
        scales: tf.Tensor | None,
    ) -> Encoded:
        """The payload of the entries at ``positions`` and of the dense-sent entries."""
        layout = self.layout
        dense_positions = layout.dense_positions(keep) if self.varies else None
        dense_values = (
            accumulated[layout.sparse_elements :]
            if dense_positions is None
            else tf.gather(accumulated, dense_positions)
        )
        values = tf.concat([tf.gather(accumulated, positions), dense_values], axis=0)
        payload, reconstruction = self.encoding.encode(values, nonfinite, scales)
        kept = tf.size(positions)
        sent = tf.concat(
            [
                layout.place_sparse(positions, reconstruction[:kept]),
                layout.place_dense(dense_positions, reconstruction[kept:]),
            ],
            axis=0,
        )
        return Encoded(payload, sent)

    def decode(
        self,
        summed: tf.Tensor,
        positions: tf.Tensor,
        num_ranks: int | tf.Tensor,
        scales: tf.Tensor | None,
    ) -> tuple[tf.Tensor, DecodedSum]:
        """The sum over ranks as a flat float32 [N] vector, and what the encoding decoded."""
        layout = self.layout
        dense_positions = layout.dense_positions(layout.keep_mask()) if self.varies else None
        decoded = self.encoding.decode(summed, num_ranks, scales)
        kept = tf.size(positions)
        flat = tf.concat(
            [
                layout.place_sparse(positions, decoded.values[:kept]),
                layout.place_dense(dense_positions, decoded.values[kept:]),
            ],
            axis=0,
        )
        return flat, decoded
