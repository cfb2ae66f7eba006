"""Gathered payloads: each rank's own positions and quantized values, decoded per rank."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import tensorflow as tf

from globaldl.compression import elias_fano
from globaldl.compression.blocks import block_layout, static_block_count
from globaldl.compression.layout import FlatLayout
from globaldl.compression.quantizer import Quantizer
from globaldl.compression.wire import GatherWireFormat

DENSE_SALT, SPARSE_SALT = 2, 3


class Encoded(NamedTuple):
    """One rank's payload, and what every receiver will decode from it."""

    payload: tf.Tensor
    sent: tf.Tensor  # float32 [N], flat layout: this rank's contribution as receivers see it


class GatherPath:
    """Per-rank top-k (or any selection) + any gatherable quantizer, in one uint8 buffer.

    The buffer layout is :class:`~globaldl.compression.wire.GatherWireFormat`; receivers
    decode every rank's buffer and add the values up (``unsorted_segment_sum``).
    """

    dtype = "uint8"

    def __init__(self, layout: FlatLayout, quantizer: Quantizer, fixed_count: bool) -> None:
        self.layout = layout
        self.quantizer = quantizer
        self.wire = GatherWireFormat(
            sparse_universe=layout.sparse_elements,
            low_bits=elias_fano.low_bits_for(layout.sparse_elements, sum(layout.static_kept)),
            bits_per_value=quantizer.bits_per_value,
            uses_scales=quantizer.uses_scales,
            block_size=quantizer.block_size,
            sparse_tensor_starts=tuple(info.offset for info in layout.sparse_infos),
        )
        self.fixed_bytes: int | None = None
        if fixed_count and not layout.dense_count_varies:
            blocks = static_block_count(layout.static_kept, self.wire.block_size)
            self.fixed_bytes = self.wire.size_bytes(
                layout.dense_elements, sum(layout.static_kept), blocks
            )

    def encode(
        self,
        accumulated: tf.Tensor,
        positions: tf.Tensor,
        keep: tf.Tensor | None,
        nonfinite: tf.Tensor,
        seed: tf.Tensor,
    ) -> Encoded:
        """Quantize the kept and the dense-sent entries of ``accumulated`` into one buffer."""
        layout = self.layout
        dense_positions = layout.dense_positions(keep)
        dense_values = (
            accumulated[layout.sparse_elements :]
            if dense_positions is None
            else tf.gather(accumulated, dense_positions)
        )
        dense = self.quantizer.quantize(
            dense_values, tf.random.experimental.stateless_fold_in(seed, DENSE_SALT)
        )
        pieces = []
        sparse = None
        if layout.sparse_infos:
            blocks = None
            if self.wire.uses_scales:
                blocks = block_layout(
                    positions,
                    tf.zeros_like(positions),
                    1,
                    np.asarray(self.wire.sparse_tensor_starts, np.int32),
                    self.wire.block_size,
                )
            sparse = self.quantizer.quantize(
                tf.gather(accumulated, positions),
                tf.random.experimental.stateless_fold_in(seed, SPARSE_SALT),
                blocks,
            )
            pieces.append(layout.place_sparse(positions, sparse.reconstruction))
        pieces.append(layout.place_dense(dense_positions, dense.reconstruction))
        payload = self.wire.encode(nonfinite, dense, positions, sparse)
        return Encoded(payload, tf.concat(pieces, axis=0))

    def decode(
        self, exchanged: tf.Tensor, lengths: tf.Tensor | None, num_ranks: tf.Tensor
    ) -> tuple[tf.Tensor, tf.Tensor]:
        """The sum over ranks (float32 [N]) and whether any rank flagged NaN/Inf.

        ``exchanged`` is every rank's buffer concatenated in rank order, ``lengths`` the
        length of each (may be None when the length is fixed). Ranks that flagged NaN/Inf
        contribute zeros.
        """
        layout = self.layout
        dense_positions = layout.dense_positions(layout.keep_mask())
        if lengths is None:
            if self.fixed_bytes is None:
                raise ValueError("lengths=None needs a fixed payload size; this payload varies")
            lengths = tf.fill([num_ranks], tf.constant(self.fixed_bytes, tf.int64))
        dense_count = layout.dense_elements if dense_positions is None else tf.size(dense_positions)
        decoded = self.wire.decode(exchanged, lengths, dense_count, self.fixed_bytes)
        any_nonfinite = tf.reduce_any(decoded.nonfinite)
        dense_values = self.quantizer.dequantize(decoded.dense_symbols, decoded.dense_scales)
        dense_values = tf.where(decoded.nonfinite[:, tf.newaxis], 0.0, dense_values)
        pieces = []
        if layout.sparse_infos:
            sparse_values = self.quantizer.dequantize(
                decoded.sparse_symbols, decoded.sparse_scales, decoded.sparse_blocks
            )
            sparse_values = tf.where(
                tf.gather(decoded.nonfinite, decoded.sparse_rank_ids), 0.0, sparse_values
            )
            pieces.append(
                tf.math.unsorted_segment_sum(
                    sparse_values, decoded.sparse_positions, layout.sparse_elements
                )
            )
        pieces.append(layout.place_dense(dense_positions, tf.reduce_sum(dense_values, axis=0)))
        return tf.concat(pieces, axis=0), any_nonfinite
