"""The byte layout of one rank's gathered payload, and decoding every rank's payload at once.

One rank's buffer (multi-byte fields little-endian; every section starts on a byte)::

    offset 0   flags           uint8: bit 0 = this rank's gradients had NaN/Inf (the rest then
                               encodes zeros); bits 1-7 are zero
    offset 1   sparse_count    uint32: K, the number of entries pruning kept
    dense      scales          ceil(D / block_size) bfloat16 scales (only quantizers with scales)
               symbols         D symbols of bits_per_value bits, least significant bit first
    sparse     index code      Elias-Fano code of the K kept positions (elias_fano.py); absent
                               when nothing is pruned
               scales          one bfloat16 per block of kept values (blocks.py)
               symbols         K symbols of bits_per_value bits

D, the number of entries sent dense, is the same on every rank (the tensors below
``dense_below_elements``, minus weights pruned to zero), so the dense section sits at the same
offset with the same length in every buffer and is decoded for all ranks with reshapes.
The sparse section varies per rank (with K, and with how K spreads over the tensors) and is
decoded for all ranks at once with ragged gathers. The static layout (which tensor sits
where, low_bits, block_size, the quantizer) is configuration shared by every rank; nothing
in the buffer repeats it.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import numpy as np
import tensorflow as tf

from globaldl.compression import elias_fano
from globaldl.compression.bitpack import pack_bits, packed_size_bytes, read_bits, unpack_rows
from globaldl.compression.blocks import BlockLayout, block_layout
from globaldl.compression.quantizer import (
    SCALE_BITS,
    QuantizedValues,
    scale_symbols,
    scales_from_symbols,
)

HEADER_BYTES = 5
SCALE_BYTES = SCALE_BITS // 8
NONFINITE_FLAG = 1


class DecodedRanks(NamedTuple):
    """Every rank's sent symbols and scales, not yet dequantized."""

    nonfinite: tf.Tensor  # bool [ranks]: the rank flagged NaN/Inf gradients
    dense_symbols: tf.Tensor  # int32 [ranks, D]
    dense_scales: tf.Tensor | None  # float32 [ranks, ceil(D / block_size)]
    sparse_positions: tf.Tensor  # int32 [total K]: flat position of each kept value
    sparse_rank_ids: tf.Tensor  # int32 [total K]: the rank that sent it
    sparse_symbols: tf.Tensor  # int32 [total K]
    sparse_scales: tf.Tensor | None  # float32 [total blocks]
    sparse_blocks: BlockLayout | None  # blocks of the kept values, numbered across ranks


@dataclasses.dataclass(frozen=True)
class GatherWireFormat:
    """Static description of the gathered payload (see the module docstring)."""

    sparse_universe: int  # entries of the pruned tensors (flat positions 0 .. n - 1)
    low_bits: int  # Elias-Fano low part width
    bits_per_value: int
    uses_scales: bool
    block_size: int
    sparse_tensor_starts: tuple[int, ...]  # first flat position of each pruned tensor

    def dense_section_bytes(self, dense_count: int | tf.Tensor) -> int | tf.Tensor:
        """Bytes of the dense section for ``dense_count`` entries."""
        symbol_bytes = packed_size_bytes(dense_count, self.bits_per_value)
        if not self.uses_scales:
            return symbol_bytes
        return (dense_count + self.block_size - 1) // self.block_size * SCALE_BYTES + symbol_bytes

    def size_bytes(self, dense_count: int, sparse_count: int, sparse_blocks: int) -> int:
        """Length of a buffer with these (static) counts."""
        index_bytes = elias_fano.encoded_size_bytes(
            sparse_count, self.sparse_universe, self.low_bits
        )
        scale_bytes = sparse_blocks * SCALE_BYTES if self.uses_scales else 0
        return int(
            HEADER_BYTES
            + self.dense_section_bytes(dense_count)
            + index_bytes
            + scale_bytes
            + packed_size_bytes(sparse_count, self.bits_per_value)
        )

    def encode(
        self,
        nonfinite: tf.Tensor,
        dense: QuantizedValues,
        sparse_positions: tf.Tensor,
        sparse: QuantizedValues | None,
    ) -> tf.Tensor:
        """One rank's buffer (uint8)."""
        flags = tf.reshape(tf.cast(nonfinite, tf.uint8) * NONFINITE_FLAG, [1])
        sparse_count = pack_bits(tf.reshape(tf.size(sparse_positions), [1]), 32)
        sections = [flags, sparse_count]
        if self.uses_scales:
            sections.append(pack_bits(scale_symbols(dense.scales), SCALE_BITS))
        sections.append(pack_bits(dense.symbols, self.bits_per_value))
        if self.sparse_universe > 0 and sparse is not None:
            sections.append(
                elias_fano.encode(sparse_positions, self.sparse_universe, self.low_bits)
            )
            if self.uses_scales:
                sections.append(pack_bits(scale_symbols(sparse.scales), SCALE_BITS))
            sections.append(pack_bits(sparse.symbols, self.bits_per_value))
        return tf.concat(sections, axis=0)

    def decode(
        self,
        buffers: tf.Tensor,
        lengths: tf.Tensor,
        dense_count: int | tf.Tensor,
        fixed_length: int | None = None,
    ) -> DecodedRanks:
        """Decode the concatenation of every rank's buffer (``lengths[r]`` bytes each).

        ``fixed_length``: every buffer has this length (then the fixed part is a reshape).
        """
        buffers = tf.reshape(tf.cast(buffers, tf.uint8), [-1])
        lengths = tf.cast(tf.reshape(lengths, [-1]), tf.int64)
        num_ranks = tf.size(lengths)
        starts = tf.cumsum(lengths, exclusive=True)
        head_bytes = HEADER_BYTES + self.dense_section_bytes(dense_count)
        if fixed_length is not None:
            rows = tf.reshape(buffers, [num_ranks, fixed_length])[:, :head_bytes]
        else:
            offsets = starts[:, tf.newaxis] + tf.range(tf.cast(head_bytes, tf.int64))[tf.newaxis]
            rows = tf.gather(buffers, offsets)
        flags = tf.cast(rows[:, 0], tf.int32)
        nonfinite = tf.not_equal(tf.bitwise.bitwise_and(flags, NONFINITE_FLAG), 0)
        sparse_counts = tf.cast(unpack_rows(rows[:, 1:HEADER_BYTES], 1, 32)[:, 0], tf.int64)
        dense_part = rows[:, HEADER_BYTES:]
        dense_scales = None
        if self.uses_scales:
            dense_blocks = (dense_count + self.block_size - 1) // self.block_size
            dense_scales = scales_from_symbols(unpack_rows(dense_part, dense_blocks, SCALE_BITS))
            dense_part = dense_part[:, dense_blocks * SCALE_BYTES :]
        dense_symbols = unpack_rows(dense_part, dense_count, self.bits_per_value)

        cursor = starts + tf.cast(head_bytes, tf.int64)
        sparse_positions = sparse_symbols = tf.zeros([0], tf.int32)
        sparse_rank_ids = tf.zeros([0], tf.int32)
        sparse_scales = sparse_blocks = None
        if self.sparse_universe > 0:
            sparse_positions = elias_fano.decode(
                buffers, cursor, sparse_counts, self.sparse_universe, self.low_bits
            )
            cursor += tf.cast(
                elias_fano.encoded_size_bytes(sparse_counts, self.sparse_universe, self.low_bits),
                tf.int64,
            )
            sparse_rank_ids = tf.repeat(tf.range(num_ranks, dtype=tf.int32), sparse_counts)
            if self.uses_scales:
                sparse_blocks = block_layout(
                    sparse_positions,
                    sparse_rank_ids,
                    num_ranks,
                    np.asarray(self.sparse_tensor_starts, np.int32),
                    self.block_size,
                )
                sparse_scales = scales_from_symbols(
                    read_bits(buffers, cursor, sparse_blocks.blocks_per_run, SCALE_BITS)
                )
                cursor += sparse_blocks.blocks_per_run * SCALE_BYTES
            sparse_symbols = read_bits(buffers, cursor, sparse_counts, self.bits_per_value)
            cursor += tf.cast(packed_size_bytes(sparse_counts, self.bits_per_value), tf.int64)
        check = tf.debugging.assert_equal(
            cursor,
            starts + lengths,
            message="gathered payload lengths do not match this compressor's wire format "
            "(every rank must use the same compression settings and variables)",
        )
        with tf.control_dependencies([check]):
            nonfinite = tf.identity(nonfinite)
        return DecodedRanks(
            nonfinite,
            dense_symbols,
            dense_scales,
            sparse_positions,
            sparse_rank_ids,
            sparse_symbols,
            sparse_scales,
            sparse_blocks,
        )
