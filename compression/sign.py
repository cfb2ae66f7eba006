"""Sign quantizer (signSGD with error feedback, Karimireddy et al. 2019): 1 bit per value."""

from __future__ import annotations

import tensorflow as tf

from globaldl.compression.quantizer import QUANTIZERS, BlockScaledQuantizer, block_mean_abs


@QUANTIZERS.register
class Sign(BlockScaledQuantizer):
    """x -> scale * sign(x), scale = mean|x| of the value's block of ``block_size`` values.

    One bit per value (1 for x >= 0), packed 8 values per byte, plus a bfloat16 scale per
    block. Biased on its own; meant to run with error feedback (the default), which turns it
    into EF-signSGD.
    """

    name = "sign"
    bits_per_value = 1

    def block_scales(self, blocks, counts):  # noqa: D102
        return block_mean_abs(blocks, counts)

    def encode(self, values, scale, seed):  # noqa: D102
        return tf.cast(values >= 0, tf.int32)

    def decode(self, symbols, scale):  # noqa: D102
        return (2.0 * tf.cast(symbols, tf.float32) - 1.0) * scale
