"""Threshold sparsifier: send every entry above a magnitude threshold estimated from a sample."""

from __future__ import annotations

import math

import tensorflow as tf

from globaldl.compression.base import check_range, check_type
from globaldl.compression.candidates import top_k_indices
from globaldl.compression.sparsifier import SPARSIFIERS, Sparsifier

DEFAULT_SAMPLE_RATIO = 0.01
DEFAULT_MIN_SAMPLE_ELEMENTS = 16384


def sample_elements(size: int, sample_ratio: float, min_sample_elements: int) -> int:
    """Sample size for a tensor of ``size`` entries: ceil(ratio * size), at least the minimum.

    Returns ``size`` (use every entry: the threshold is exact) when the sample would be a
    quarter of the tensor or more: there an exact top-k costs less than sampling (measured:
    2.9 ms exact against 6.7 ms sampled for 36,864 entries; 29 ms against 6.5 ms for 10**6).
    """
    samples = max(math.ceil(sample_ratio * size), min_sample_elements)
    return size if 4 * samples >= size else samples


def estimate_threshold(
    magnitudes: tf.Tensor, fraction: float | tf.Tensor, num_samples: int, seed: tf.Tensor
) -> tf.Tensor:
    """The magnitude above which about ``fraction`` of ``magnitudes`` lie (float32 scalar).

    Draws ``num_samples`` entries uniformly with replacement and returns the
    ceil(fraction * num_samples)-th largest sampled magnitude; with ``num_samples`` >= the
    tensor size it uses every entry and is exact. Cost: one gather and one small top-k instead
    of a top-k over the whole tensor (what Deep Gradient Compression does on large layers).
    """
    size = int(magnitudes.shape[0])
    if num_samples >= size:
        sample, num_samples = magnitudes, size
    else:
        drawn = tf.random.stateless_uniform([num_samples], seed, 0, size, dtype=tf.int32)
        sample = tf.gather(magnitudes, drawn)
    above = tf.cast(tf.math.ceil(tf.cast(fraction, tf.float64) * num_samples), tf.int32)
    above = tf.clip_by_value(above, 1, num_samples)
    return tf.math.top_k(sample, above, sorted=True).values[above - 1]


class SampledThresholdMixin:
    """Validation and config of the sampling settings shared by Threshold and DGC."""

    sample_ratio: float
    min_sample_elements: int

    def _set_sampling(self, sample_ratio: float, min_sample_elements: int) -> None:
        check_type("sample_ratio", sample_ratio, (int, float))
        check_range("sample_ratio", sample_ratio, 0.0, 1.0, low_inclusive=False)
        check_type("min_sample_elements", min_sample_elements, int)
        check_range("min_sample_elements", min_sample_elements, 1)
        self.sample_ratio = float(sample_ratio)
        self.min_sample_elements = min_sample_elements

    def _sampling_config(self) -> dict[str, float | int]:
        return {"sample_ratio": self.sample_ratio, "min_sample_elements": self.min_sample_elements}

    def num_samples(self, size: int) -> int:
        """How many entries of a ``size``-entry tensor the threshold estimate looks at."""
        return sample_elements(size, self.sample_ratio, self.min_sample_elements)


@SPARSIFIERS.register
class Threshold(SampledThresholdMixin, Sparsifier):
    """Sends every non-zero entry whose magnitude reaches the estimated (1 - density) quantile.

    The threshold is re-estimated every step from a random sample (see
    :func:`estimate_threshold`), so the number sent varies around k = density * size and the
    payload length varies with it. Tensors up to 4 * ``min_sample_elements`` entries use an
    exact threshold (ties can then still send a few more than k).

    Sampling error, measured (100 draws each on Gaussian and Laplace tensors of 10**5 and
    10**6 entries, max(1%, 16384) samples): sent / k had 5th-95th percentiles 0.88-1.15 at
    density 0.01 (extremes 0.78-1.31) and 0.59-1.52 at density 0.001 (extremes 0.45-1.92),
    mean within 7% of 1: only about density * samples sampled entries lie above the estimate,
    so the relative spread is about 1 / sqrt(density * samples). Error feedback keeps what a
    low count leaves out. tests/compression/test_sparsifiers.py checks these bounds.
    """

    name = "threshold"
    fixed_count = False

    def __init__(
        self,
        sample_ratio: float = DEFAULT_SAMPLE_RATIO,
        min_sample_elements: int = DEFAULT_MIN_SAMPLE_ELEMENTS,
    ) -> None:
        self._set_sampling(sample_ratio, min_sample_elements)

    def get_config(self):  # noqa: D102
        return self._sampling_config()

    @classmethod
    def from_compression_config(cls, config, num_ranks=1):  # noqa: D102
        return cls(config.sample_ratio, config.min_sample_elements)

    def select(self, magnitudes, num_kept, seed):  # noqa: D102
        size = int(magnitudes.shape[0])
        num_samples = self.num_samples(size)
        if num_samples >= size:  # exact: the k-th largest magnitude
            top = top_k_indices(magnitudes, num_kept, seed)
            threshold = tf.reduce_min(tf.gather(magnitudes, top))
        else:
            fraction = tf.cast(num_kept, tf.float64) / size
            threshold = estimate_threshold(magnitudes, fraction, num_samples, seed)
        chosen = tf.logical_and(magnitudes >= threshold, magnitudes > 0.0)
        return tf.cast(tf.where(chosen)[:, 0], tf.int32)
