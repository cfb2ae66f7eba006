"""Step 2 of the compression: the quantizer interface, its registry and the lossless no-op."""

from __future__ import annotations

from typing import ClassVar, NamedTuple

import numpy as np
import tensorflow as tf

from globaldl.compression.base import Codec, Registry, check_range, check_type
from globaldl.compression.blocks import BlockLayout
from globaldl.compression.summable import FloatSum, SumEncoding

SCALE_BITS = 16
"""Block scales travel as bfloat16 (the top 16 bits of a float32), rounded up; see wire_scales."""


class QuantizedValues(NamedTuple):
    """The output of :meth:`Quantizer.quantize`."""

    symbols: tf.Tensor  # int32 [n]: each a ``bits_per_value``-bit symbol
    scales: tf.Tensor  # float32 [num_blocks], exactly as the receiver will read them ([0] if none)
    reconstruction: tf.Tensor  # float32 [n]: what the receiver decodes (error feedback uses it)


class Quantizer(Codec):
    """Maps float32 values to small integer symbols, plus one scale per block of values.

    A subclass is pure elementwise arithmetic; framing (bit packing, blocks, how scales travel)
    is done by the base class and the wire format. A subclass sets the class attributes

    * ``name``: its registry name;
    * ``bits_per_value``: the width of one symbol (may be a property depending on settings);
    * ``uses_scales``: True if it needs one scale per block (then derive from
      :class:`BlockScaledQuantizer`, which holds ``block_size``);
    * ``is_lossless`` / ``is_unbiased``: what its tests hold it to;
    * ``sum_dtype``: the float dtype in which its values can be added across ranks so that
      the sum decodes to the sum of the values (None, the default, when they can only be
      gathered); a quantizer whose sums need more (shared scales, integer lanes) overrides
      ``sum_encoding`` instead;
    * ``gatherable``: False for a quantizer whose payloads can only be summed;

    and overrides

    * ``encode(values, scale, seed) -> int32 symbols in [0, 2**bits_per_value)``;
    * ``decode(symbols, scale) -> float32 values``;
    * ``block_scales(blocks, counts) -> float32 [num_blocks]`` when ``uses_scales``: ``blocks``
      is a zero-padded [num_blocks, block_size] matrix and ``counts`` the number of real
      values in each row.

    ``encode`` and ``decode`` must be elementwise: ``scale`` broadcasts against ``values``
    (it is None without scales). ``quantize`` and ``dequantize`` (do not override) run them
    over consecutive blocks (entries sent dense) or given blocks (entries kept by pruning), and
    return the symbols, the scales as sent and the receiver's reconstruction. Example::

        @QUANTIZERS.register
        class Halve(Quantizer):
            name = "halve"
            bits_per_value = 16
            def encode(self, values, scale, seed):
                return tf.cast(tf.bitcast(tf.cast(values, tf.float16), tf.uint16), tf.int32)
            def decode(self, symbols, scale):
                return tf.cast(tf.bitcast(tf.cast(symbols, tf.uint16), tf.float16), tf.float32)
    """

    bits_per_value: ClassVar[int] = 32
    uses_scales: ClassVar[bool] = False
    is_lossless: ClassVar[bool] = False
    is_unbiased: ClassVar[bool] = False
    sum_dtype: ClassVar[str | None] = None
    gatherable: ClassVar[bool] = True
    block_size: int = 1

    def sum_encoding(
        self, num_ranks: int, value_groups: np.ndarray, num_groups: int
    ) -> SumEncoding | None:
        """How payloads of V = len(value_groups) values add up across ``num_ranks`` ranks.

        None when they cannot (the payloads are then gathered). ``value_groups`` gives the
        scale group (tensor) of each value, for encodings with shared scales.
        """
        if self.sum_dtype is None:
            return None
        return FloatSum(self, self.sum_dtype, int(np.size(value_groups)))

    def encode(self, values: tf.Tensor, scale: tf.Tensor | None, seed: tf.Tensor) -> tf.Tensor:
        """Symbols for ``values``."""
        raise NotImplementedError(f"{type(self).__name__} must override encode")

    def decode(self, symbols: tf.Tensor, scale: tf.Tensor | None) -> tf.Tensor:
        """Values the symbols stand for."""
        raise NotImplementedError(f"{type(self).__name__} must override decode")

    def block_scales(self, blocks: tf.Tensor, counts: tf.Tensor) -> tf.Tensor:
        """One non-negative scale per row of ``blocks``."""
        raise NotImplementedError(
            f"{type(self).__name__} uses scales and must override block_scales"
        )

    def quantize(
        self, values: tf.Tensor, seed: tf.Tensor | None = None, blocks: BlockLayout | None = None
    ) -> QuantizedValues:
        """Quantize a 1-D vector, in consecutive blocks of ``block_size`` or in ``blocks``."""
        values = tf.reshape(tf.cast(values, tf.float32), [-1])
        seed = tf.zeros([2], tf.int64) if seed is None else seed
        if not self.uses_scales:
            symbols = self.encode(values, None, seed)
            return QuantizedValues(symbols, tf.zeros([0], tf.float32), self.decode(symbols, None))
        if blocks is None:
            matrix, counts = _consecutive_blocks(values, self.block_size)
            scales = wire_scales(self.block_scales(matrix, counts))
            symbols = self.encode(matrix, scales[:, tf.newaxis], seed)
            reconstruction = self.decode(symbols, scales[:, tf.newaxis])
            size = tf.size(values)
            return QuantizedValues(
                tf.reshape(symbols, [-1])[:size], scales, tf.reshape(reconstruction, [-1])[:size]
            )
        coordinates = tf.stack([blocks.block_ids, blocks.index_in_block], axis=1)
        matrix = tf.scatter_nd(coordinates, values, tf.stack([blocks.num_blocks, self.block_size]))
        counts = tf.math.unsorted_segment_sum(
            tf.ones_like(values), blocks.block_ids, blocks.num_blocks
        )
        scales = wire_scales(self.block_scales(matrix, counts))
        scale_per_value = tf.gather(scales, blocks.block_ids)
        symbols = self.encode(values, scale_per_value, seed)
        return QuantizedValues(symbols, scales, self.decode(symbols, scale_per_value))

    def dequantize(
        self, symbols: tf.Tensor, scales: tf.Tensor | None, blocks: BlockLayout | None = None
    ) -> tf.Tensor:
        """Values from symbols and the scales as sent (inverse of :meth:`quantize`).

        Without ``blocks``, ``symbols`` is [..., n] and ``scales`` [..., num_blocks] for
        consecutive blocks (the leading axes, e.g. ranks, are kept).
        """
        if not self.uses_scales:
            return self.decode(symbols, None)
        if blocks is not None:
            return self.decode(symbols, tf.gather(scales, blocks.block_ids))
        size = tf.shape(symbols)[-1]
        padded, _ = _consecutive_blocks(symbols, self.block_size)
        values = self.decode(padded, scales[..., tf.newaxis])
        leading = tf.shape(symbols)[:-1]
        return tf.reshape(values, tf.concat([leading, [-1]], axis=0))[..., :size]

    @classmethod
    def from_compression_config(cls, config: object) -> Quantizer:
        """Build from a :class:`~globaldl.compression.CompressionConfig` (default: no settings)."""
        return cls()


def _consecutive_blocks(values: tf.Tensor, block_size: int) -> tuple[tf.Tensor, tf.Tensor]:
    """[..., n] -> zero-padded [..., ceil(n / block_size), block_size] and the real counts."""
    size = tf.shape(values)[-1]
    num_blocks = (size + block_size - 1) // block_size
    padding = num_blocks * block_size - size
    rank = len(values.shape)
    padded = tf.pad(values, [[0, 0]] * (rank - 1) + [[0, padding]])
    leading = tf.shape(values)[:-1]
    matrix = tf.reshape(padded, tf.concat([leading, [num_blocks, block_size]], axis=0))
    counts = tf.minimum(block_size, size - tf.range(num_blocks) * block_size)
    return matrix, tf.cast(counts, tf.float32)


QUANTIZERS: Registry[Quantizer] = Registry("quantizer", Quantizer)


@QUANTIZERS.register
class NoQuantization(Quantizer):
    """Sends float32 values as they are (32 bits each)."""

    name = "none"
    bits_per_value = 32
    is_lossless = True
    is_unbiased = True
    sum_dtype = "float32"

    def encode(self, values, scale, seed):  # noqa: D102
        return tf.bitcast(values, tf.int32)

    def decode(self, symbols, scale):  # noqa: D102
        return tf.bitcast(tf.cast(symbols, tf.int32), tf.float32)


class BlockScaledQuantizer(Quantizer):
    """A quantizer with one scale per block of ``block_size`` sent values.

    Subclasses override ``block_scales``, ``encode`` and ``decode``; this class holds and
    validates ``block_size`` (receivers need it to find the blocks; blocks.py says how blocks
    are formed).
    """

    uses_scales = True

    def __init__(self, block_size: int = 256) -> None:  # noqa: D107
        check_type("block_size", block_size, int)
        check_range("block_size", block_size, 1)
        self.block_size = block_size

    def get_config(self):  # noqa: D102
        return {"block_size": self.block_size}

    @classmethod
    def from_compression_config(cls, config):  # noqa: D102
        return cls(block_size=config.block_size)


def wire_scales(scales: tf.Tensor) -> tf.Tensor:
    """Round non-negative float32 scales UP to the nearest bfloat16 value.

    Rounding up (never down) keeps every quantizer's guarantee intact with the scale the
    receiver actually sees: int8 codes stay within +-127, TernGrad and QSGD probabilities stay
    at most 1 (so they remain unbiased). The cost is at most 2**-8 relative scale error.
    """
    bits = tf.bitcast(tf.cast(scales, tf.float32), tf.int32)
    truncated = tf.bitwise.bitwise_and(bits, ~0xFFFF)
    rounded = truncated + tf.where(tf.not_equal(truncated, bits), 0x10000, 0)
    largest_finite = 0x7F7F0000  # rounding up past it would give +inf
    return tf.bitcast(tf.minimum(rounded, largest_finite), tf.float32)


def scale_symbols(scales: tf.Tensor) -> tf.Tensor:
    """The 16-bit symbols of scales already rounded by :func:`wire_scales`."""
    return tf.bitwise.right_shift(tf.bitcast(scales, tf.int32), 16)


def scales_from_symbols(symbols: tf.Tensor) -> tf.Tensor:
    """Inverse of :func:`scale_symbols`."""
    return tf.bitcast(tf.bitwise.left_shift(tf.cast(symbols, tf.int32), 16), tf.float32)


def block_max_abs(blocks: tf.Tensor, counts: tf.Tensor) -> tf.Tensor:
    """Max |value| of each block (padding zeros do not change it)."""
    return tf.reduce_max(tf.abs(blocks), axis=1)


def block_mean_abs(blocks: tf.Tensor, counts: tf.Tensor) -> tf.Tensor:
    """Mean |value| over the real values of each block."""
    return tf.math.divide_no_nan(tf.reduce_sum(tf.abs(blocks), axis=1), counts)


def block_l2_norm(blocks: tf.Tensor, counts: tf.Tensor) -> tf.Tensor:
    """L2 norm of each block (padding zeros do not change it)."""
    return tf.sqrt(tf.reduce_sum(tf.square(blocks), axis=1))


def safe_divide(numerator: tf.Tensor, denominator: tf.Tensor) -> tf.Tensor:
    """Numerator / denominator, and 0 where the denominator is 0 (an all-zero block)."""
    return tf.math.divide_no_nan(numerator, denominator)
