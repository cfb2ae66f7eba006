"""Elias-Fano coding of the sorted positions a sparsifier keeps: about 2 + log2(n / k) bits each.

A sorted list of ``k`` positions below ``universe`` is split into ``low_bits`` low bits per
position (bit-packed as they are) and the remaining high part, written in unary: bit
``(position >> low_bits) + j`` is set for the ``j``-th position. With
``low_bits = floor(log2(universe / k))`` the code takes at most 2 + log2(universe / k) bits
per position (plus byte padding), within 2 bits of the information-theoretic minimum, and
its length depends only on ``k`` (so top-k payloads have a fixed size). At density 0.001
that is about 12 bits per position instead of 32 (int32) or 16 (uint16 block-local
indices); at density 0.01 about 8.6. ``low_bits`` is fixed from the configured density, so the
receiver needs no per-payload parameter; a count c different from the configured one still
decodes and costs c * (low_bits + 1) + (universe >> low_bits) + 1 bits: during DGC's warm-up
(c up to 250 times the final count) that is low_bits + 1 bits per position rather than the
2 + log2(universe / c) a matched code would take.

Decoding is vectorised: the set bits of the unary part are found with one ``tf.where``,
for the runs of every rank at once.
"""

from __future__ import annotations

import math

import tensorflow as tf

from globaldl.compression.bitpack import pack_bits, packed_size_bytes, read_bits


def low_bits_for(universe: int, expected_count: int) -> int:
    """The low-part width that minimises the code size for ``expected_count`` positions."""
    if universe <= 0 or expected_count <= 0 or expected_count >= universe:
        return 0
    return int(math.floor(math.log2(universe / expected_count)))


def unary_length_bits(count: int | tf.Tensor, universe: int, low_bits: int) -> int | tf.Tensor:
    """Length of the unary high part for ``count`` positions (0 when the universe is empty)."""
    if universe <= 0:
        return count * 0
    return count + ((universe - 1) >> low_bits) + 1


def encoded_size_bytes(count: int | tf.Tensor, universe: int, low_bits: int) -> int | tf.Tensor:
    """Bytes of the whole code (low part, then unary part, each padded to a byte)."""
    return packed_size_bytes(count, low_bits) + packed_size_bytes(
        unary_length_bits(count, universe, low_bits), 1
    )


def encode(positions: tf.Tensor, universe: int, low_bits: int) -> tf.Tensor:
    """Encode sorted, distinct int32 positions in ``[0, universe)`` as uint8 bytes."""
    if universe <= 0:
        return tf.zeros([0], tf.uint8)
    positions = tf.cast(tf.reshape(positions, [-1]), tf.int32)
    count = tf.size(positions)
    low_mask = (1 << low_bits) - 1
    low_part = pack_bits(tf.bitwise.bitwise_and(positions, low_mask), low_bits)
    set_bits = tf.bitwise.right_shift(positions, low_bits) + tf.range(count, dtype=tf.int32)
    unary = tf.scatter_nd(
        set_bits[:, tf.newaxis],
        tf.ones([count], tf.int32),
        tf.reshape(unary_length_bits(count, universe, low_bits), [1]),
    )
    return tf.concat([low_part, pack_bits(unary, 1)], axis=0)


def decode(
    buffer: tf.Tensor, start_bytes: tf.Tensor, counts: tf.Tensor, universe: int, low_bits: int
) -> tf.Tensor:
    """Decode several runs at once (run r: ``counts[r]`` positions at ``start_bytes[r]``).

    Returns every run's positions concatenated in run order, as int32.
    """
    start_bytes = tf.cast(tf.reshape(start_bytes, [-1]), tf.int64)
    counts = tf.cast(tf.reshape(counts, [-1]), tf.int64)
    if universe <= 0:
        return tf.zeros([0], tf.int32)
    low_part = read_bits(buffer, start_bytes, counts, low_bits)
    unary_starts = start_bytes + packed_size_bytes(counts, low_bits)
    unary_lengths = unary_length_bits(counts, universe, low_bits)
    unary = read_bits(buffer, unary_starts, unary_lengths, 1)
    # The j-th set bit of a run sits at (high part) + j within that run.
    set_bits = tf.where(tf.equal(unary, 1))[:, 0]
    run_of_bit = tf.repeat(tf.range(tf.size(counts, out_type=tf.int64)), counts)
    unary_run_starts = tf.cumsum(unary_lengths, exclusive=True)
    count_run_starts = tf.cumsum(counts, exclusive=True)
    index_in_run = tf.range(tf.reduce_sum(counts)) - tf.gather(count_run_starts, run_of_bit)
    high_part = set_bits - tf.gather(unary_run_starts, run_of_bit) - index_in_run
    return tf.cast(tf.bitwise.left_shift(high_part, low_bits), tf.int32) + low_part
