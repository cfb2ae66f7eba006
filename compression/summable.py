"""Payloads that add up across ranks: float sums, and integer codes summed in packed lanes.

A summable payload carries, in one vector of one dtype, the values every rank sends at the
same positions, then one NaN/Inf flag, then (for integer codes) a few counters. The exchange
adds the ranks' vectors element by element (one allreduce) and every rank decodes the sum.

``FloatSum`` is what Horovod does: float32 values, or float16 (Horovod's Compression.fp16).

``LaneSum`` sends integer codes on a scale every rank shares, and sums them exactly:

* Each value becomes a code c in [-L, L] on its group's (tensor's) shared scale s, sent as
  c + L in [0, 2L]. Summed over N ranks a lane holds at most 2 L N; L = floor((2**w - 1) /
  (2 N)) keeps that below 2**w for lanes of w bits, so a lane never overflows and the sum
  decodes exactly to (sum - N L) s. The wire cost per value is fixed by w, whatever N: more
  ranks mean fewer levels per rank, not more bytes (the sum keeps 2**w levels).
* Lanes are packed into the narrowest word Horovod can allreduce (uint8, int32 or int64; the
  HorovodAllreduce op has no int16): w = 8 is one byte per value; w = 4 two per byte; w = 12
  five lanes per int64 word (12.8 bits each). Words add lane by lane without carries because
  no lane sum reaches 2**w, and the top lane stays below the word's sign bit.
* The scale is agreed without an extra round trip. Every rank appends, per group, a one-hot
  of d = ceil(log2(max|x| / (s L))) clipped to [-R, R] (2R + 1 counter lanes); after the sum
  every rank sees how many ranks needed each power of two and sets the next step's scale to
  s * 2**d_max. Every rank applies the same rule to the same counts, so the scales stay
  identical without being sent. The scale is one step old: a value beyond s L is clipped, and
  what clipping (and rounding) removed stays in the sender's error-feedback residual and goes
  out in a later step. An extra max-allreduce would give an exact scale at the price of one
  more collective, i.e. one more latency-bound ring per step on a wide-area link.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import tensorflow as tf

from globaldl.compression.lanes import lane_word, levels_for

SCALE_RANGE = 3
"""R: a scale moves by at most 2**R (8x) per step; 2R + 1 counter lanes per group."""

INITIAL_RANGE = 2.0**-4
"""s L at the first step, before any rank has reported its magnitudes (about a LeNet
gradient's largest entry); the controller corrects it by up to 8x per step."""

SMALLEST_SCALE, LARGEST_SCALE = 2.0**-100, 2.0**100


class DecodedSum(NamedTuple):
    """What every rank reads from the summed payload."""

    values: tf.Tensor  # float32 [V]: the sum over ranks of what each sent
    any_nonfinite: tf.Tensor  # bool: some rank flagged NaN/Inf gradients (and sent zeros)
    scales: tf.Tensor | None  # float32 [G]: the next step's shared scales (LaneSum only)


class SumEncoding:
    """How V float values (plus the NaN/Inf flag) become one summable vector, and back.

    Subclasses set ``dtype`` and ``payload_elements`` and override ``encode`` and
    ``decode``. ``uses_scales`` encodings also need the shared scales (``initial_scales``),
    which the compressor keeps as state identical on every rank. ``accepts_variable_length``
    encodings take any number of values at each step (the same on every rank).
    """

    dtype: str = "float32"
    uses_scales: bool = False
    accepts_variable_length: bool = False
    payload_elements: int = 0

    def encode(
        self, values: tf.Tensor, nonfinite: tf.Tensor, scales: tf.Tensor | None
    ) -> tuple[tf.Tensor, tf.Tensor]:
        """The rank's payload, and what receivers will decode from it (for error feedback)."""
        raise NotImplementedError

    def decode(
        self, summed: tf.Tensor, num_ranks: int | tf.Tensor, scales: tf.Tensor | None
    ) -> DecodedSum:
        """The sum of every rank's values from the sum of their payloads."""
        raise NotImplementedError

    def initial_scales(self) -> np.ndarray:
        """The shared scales before the first step (empty without scales)."""
        return np.zeros([0], np.float32)


class FloatSum(SumEncoding):
    """Values as floats (rounded by the quantizer, e.g. to fp16) and a trailing 0/1 flag."""

    accepts_variable_length = True

    def __init__(self, quantizer: object, dtype: str, num_values: int) -> None:
        self.quantizer = quantizer
        self.dtype = dtype
        self.payload_elements = num_values + 1

    def encode(self, values, nonfinite, scales):  # noqa: D102
        reconstruction = self.quantizer.quantize(values).reconstruction  # type: ignore[attr-defined]
        flag = tf.cast(tf.reshape(nonfinite, [1]), tf.float32)
        payload = tf.cast(tf.concat([reconstruction, flag], axis=0), self.dtype)
        return payload, reconstruction

    def decode(self, summed, num_ranks, scales):  # noqa: D102
        summed = tf.cast(tf.reshape(summed, [-1]), tf.float32)
        return DecodedSum(summed[:-1], summed[-1] > 0.5, None)


class LaneSum(SumEncoding):
    """Integer codes on shared per-group scales, summed exactly in packed lanes (module doc).

    Args:
        lane_bits: w, the bits of one lane (one value) on the wire.
        num_ranks: N, the ranks whose payloads are summed.
        value_groups: int32 [V], the scale group (tensor) of each value.
        num_groups: G.

    """

    uses_scales = True

    def __init__(
        self, lane_bits: int, num_ranks: int, value_groups: np.ndarray, num_groups: int
    ) -> None:
        self.lane_bits = lane_bits
        self.num_ranks = num_ranks
        self.levels = levels_for(lane_bits, num_ranks)
        self.dtype, self.lanes_per_word = lane_word(lane_bits)
        self.value_groups = np.asarray(value_groups, np.int32)
        self.num_values = int(self.value_groups.size)
        self.num_groups = num_groups
        bins = 2 * SCALE_RANGE + 1
        self.num_lanes = self.num_values + 1 + num_groups * bins
        self.payload_elements = -(-self.num_lanes // self.lanes_per_word)

    def initial_scales(self) -> np.ndarray:  # noqa: D102
        # A power of two, so that codes times scale are exact in float32.
        scale = 2.0 ** math.floor(math.log2(INITIAL_RANGE / self.levels))
        return np.full([self.num_groups], scale, np.float32)

    def encode(self, values, nonfinite, scales):  # noqa: D102
        values = tf.reshape(tf.cast(values, tf.float32), [-1])
        groups = tf.constant(self.value_groups)
        scale_of_value = tf.gather(scales, groups)
        levels = float(self.levels)
        codes = tf.clip_by_value(tf.round(values / scale_of_value), -levels, levels)
        reconstruction = codes * scale_of_value
        largest = tf.maximum(
            tf.math.unsorted_segment_max(tf.abs(values), groups, self.num_groups), 0.0
        )
        needed = tf.math.ceil(tf.math.log(largest / (scales * levels)) / math.log(2.0))
        needed = tf.where(largest > 0.0, needed, -float(SCALE_RANGE))
        needed = tf.cast(tf.clip_by_value(needed, -SCALE_RANGE, SCALE_RANGE), tf.int32)
        counters = tf.one_hot(needed + SCALE_RANGE, 2 * SCALE_RANGE + 1, dtype=tf.int64)
        lanes = tf.concat(
            [
                tf.cast(codes, tf.int64) + self.levels,
                tf.cast(tf.reshape(nonfinite, [1]), tf.int64),
                tf.reshape(counters, [-1]),
            ],
            axis=0,
        )
        return self._pack(lanes), reconstruction

    def decode(self, summed, num_ranks, scales):  # noqa: D102
        lanes = self._unpack(summed)
        offset = tf.cast(num_ranks, tf.int64) * self.levels
        code_sums = lanes[: self.num_values] - offset
        values = tf.cast(code_sums, tf.float32) * tf.gather(scales, self.value_groups)
        any_nonfinite = lanes[self.num_values] > 0
        counts = tf.reshape(lanes[self.num_values + 1 :], [self.num_groups, -1])
        bins = tf.range(-SCALE_RANGE, SCALE_RANGE + 1, dtype=tf.int64)
        # The largest power of two any rank needed (every rank reports one bin per group).
        needed = tf.reduce_max(tf.where(counts > 0, bins, -SCALE_RANGE), axis=1)
        new_scales = tf.clip_by_value(
            scales * tf.pow(2.0, tf.cast(needed, tf.float32)), SMALLEST_SCALE, LARGEST_SCALE
        )
        return DecodedSum(values, any_nonfinite, new_scales)

    def _pack(self, lanes: tf.Tensor) -> tf.Tensor:
        """int64 lane values (each < 2**w) -> words of ``dtype``, lane j at bits w j."""
        padding = self.payload_elements * self.lanes_per_word - self.num_lanes
        grid = tf.reshape(tf.pad(lanes, [[0, padding]]), [-1, self.lanes_per_word])
        shifts = tf.constant(self.lane_bits * np.arange(self.lanes_per_word), tf.int64)
        words = tf.reduce_sum(tf.bitwise.left_shift(grid, shifts), axis=1)
        return tf.cast(words, self.dtype)

    def _unpack(self, words: tf.Tensor) -> tf.Tensor:
        """Inverse of :meth:`_pack` for a sum of packed payloads (lane sums stay < 2**w)."""
        words = tf.cast(tf.reshape(words, [-1]), tf.int64)
        if self.dtype == "uint8":
            words = tf.bitwise.bitwise_and(words, 0xFF)  # uint8 -> int64 keeps the bits
        shifts = tf.constant(self.lane_bits * np.arange(self.lanes_per_word), tf.int64)
        mask = tf.constant(2**self.lane_bits - 1, tf.int64)
        grid = tf.bitwise.bitwise_and(tf.bitwise.right_shift(words[:, tf.newaxis], shifts), mask)
        return tf.reshape(grid, [-1])[: self.num_lanes]
