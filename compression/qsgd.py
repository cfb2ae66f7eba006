"""QSGD quantizer (Alistarh et al. 2017): stochastic rounding to s levels of the block norm."""

from __future__ import annotations

import math

import tensorflow as tf

from globaldl.compression.base import check_range, check_type
from globaldl.compression.quantizer import (
    QUANTIZERS,
    BlockScaledQuantizer,
    block_l2_norm,
    safe_divide,
)

MAX_LEVELS = 32767


@QUANTIZERS.register
class QSGD(BlockScaledQuantizer):
    """Unbiased stochastic quantization: x -> norm * sign(x) * l / s, with E[l / s] = |x| / norm.

    ``norm`` is the L2 norm of the value's block of ``block_size`` values (QSGD's "bucket"),
    ``s = levels``, and ``l`` is ``floor(|x| / norm * s)`` rounded up with probability equal to
    the fractional part. A symbol is ``sign * l + s`` in [0, 2s]: ceil(log2(2s + 1)) bits
    (6 bits for the default 16 levels). Variance per value <= norm**2 / (4 s**2).
    """

    name = "qsgd"
    is_unbiased = True

    def __init__(self, levels: int = 16, block_size: int = 256) -> None:
        check_type("levels", levels, int)
        check_range("levels", levels, 1, MAX_LEVELS)
        super().__init__(block_size)
        self.levels = levels

    @property
    def bits_per_value(self) -> int:  # type: ignore[override]
        """ceil(log2(2 * levels + 1))."""
        return math.ceil(math.log2(2 * self.levels + 1))

    def get_config(self):  # noqa: D102
        return {"levels": self.levels, "block_size": self.block_size}

    @classmethod
    def from_compression_config(cls, config):  # noqa: D102
        return cls(levels=config.qsgd_levels, block_size=config.block_size)

    def block_scales(self, blocks, counts):  # noqa: D102
        return block_l2_norm(blocks, counts)

    def encode(self, values, scale, seed):  # noqa: D102
        scaled = safe_divide(tf.abs(values), scale) * self.levels
        noise = tf.random.stateless_uniform(tf.shape(values), seed)
        level = tf.minimum(tf.floor(scaled + noise), self.levels)
        signed = tf.where(values < 0, -level, level)
        return tf.cast(signed, tf.int32) + self.levels

    def decode(self, symbols, scale):  # noqa: D102
        return tf.cast(symbols - self.levels, tf.float32) / self.levels * scale
