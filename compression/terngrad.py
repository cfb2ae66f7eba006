"""TernGrad quantizer (Wen et al. 2017): each value becomes -1, 0 or +1 times the block max."""

from __future__ import annotations

import tensorflow as tf

from globaldl.compression.quantizer import (
    QUANTIZERS,
    BlockScaledQuantizer,
    block_max_abs,
    safe_divide,
)


@QUANTIZERS.register
class TernGrad(BlockScaledQuantizer):
    """Unbiased ternary quantization: x -> scale * sign(x) * b, b ~ Bernoulli(|x| / scale).

    ``scale`` is max|x| of the value's block of ``block_size`` values (the paper uses one
    scale per layer; blocks bound the variance on large layers). 2 bits per value (symbols 0, 1,
    2 stand for -1, 0, +1). The paper's optional gradient clipping at 2.5 sigma is not applied:
    it would bias the estimate, and error feedback plus DGC's clipping cover that ground.
    """

    name = "terngrad"
    bits_per_value = 2
    is_unbiased = True

    def block_scales(self, blocks, counts):  # noqa: D102
        return block_max_abs(blocks, counts)

    def encode(self, values, scale, seed):  # noqa: D102
        probability = safe_divide(tf.abs(values), scale)
        keep = tf.random.stateless_uniform(tf.shape(values), seed) < probability
        ternary = tf.where(keep, tf.where(values < 0, -1, 1), 0)
        return ternary + 1

    def decode(self, symbols, scale):  # noqa: D102
        return tf.cast(symbols - 1, tf.float32) * scale
