"""fp16 quantizer: values as IEEE half precision, 16 bits each, no scale."""

from __future__ import annotations

import tensorflow as tf

from globaldl.compression.quantizer import QUANTIZERS, Quantizer

FLOAT16_MAX = 65504.0


@QUANTIZERS.register
class FP16(Quantizer):
    """Rounds each value to float16 (relative error <= 2**-11 for |x| >= 2**-14).

    Values beyond +-65504 are clipped to it rather than sent as infinities, and values below
    the float16 subnormal range (about 6e-8) flush to zero; error feedback carries both
    differences to the next step. Without pruning the fp16 payload can be summed by
    allreduce: the sum is then formed in float16, so it can overflow when many ranks send
    values near the limit.
    """

    name = "fp16"
    bits_per_value = 16
    sum_dtype = "float16"  # Horovod's own Compression.fp16: the allreduce adds float16 values

    def encode(self, values, scale, seed):  # noqa: D102
        half = tf.cast(tf.clip_by_value(values, -FLOAT16_MAX, FLOAT16_MAX), tf.float16)
        return tf.cast(tf.bitcast(half, tf.uint16), tf.int32)

    def decode(self, symbols, scale):  # noqa: D102
        return tf.cast(tf.bitcast(tf.cast(symbols, tf.uint16), tf.float16), tf.float32)
