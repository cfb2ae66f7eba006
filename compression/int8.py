"""int8 quantizer: 8-bit codes with one max-abs scale per block."""

from __future__ import annotations

import tensorflow as tf

from globaldl.compression.quantizer import (
    QUANTIZERS,
    BlockScaledQuantizer,
    block_max_abs,
    safe_divide,
)

LEVELS = 127


@QUANTIZERS.register
class Int8(BlockScaledQuantizer):
    """Linear 8-bit quantization, round to nearest, one scale per block of ``block_size`` values.

    Scale = max|x| / 127 over the block (rounded up to bfloat16); code = round(x / scale) in
    [-127, 127], sent as code + 127. Error per value <= scale / 2 <= max|x| / 254 * (1 + 2**-8).
    Deterministic (biased) rounding: error feedback makes up the difference.
    """

    name = "int8"
    bits_per_value = 8

    def block_scales(self, blocks, counts):  # noqa: D102
        return block_max_abs(blocks, counts) / LEVELS

    def encode(self, values, scale, seed):  # noqa: D102
        codes = tf.clip_by_value(tf.round(safe_divide(values, scale)), -LEVELS, LEVELS)
        return tf.cast(codes, tf.int32) + LEVELS

    def decode(self, symbols, scale):  # noqa: D102
        return tf.cast(symbols - LEVELS, tf.float32) * scale
