"""Bit packing: unsigned integer symbols of any width 0..32 to bytes and back, vectorised.

Every byte-level layout in globaldl's payloads goes through these two functions: sign bits
(width 1), TernGrad trits (2), QSGD levels, int8 codes, fp16/fp32 bit patterns, bfloat16
scales, and both halves of the Elias-Fano index code.

Bit order: symbol bits are written least significant bit first, and bits fill each byte from
its least significant bit. For widths 8, 16 and 32 this is exactly the little-endian byte
layout, which is how those widths are packed (by ``tf.bitcast``, on the little-endian CPUs
globaldl targets) without going through single bits.
"""

from __future__ import annotations

import tensorflow as tf

_BYTE_ALIGNED_DTYPES = {8: tf.uint8, 16: tf.uint16, 32: tf.int32}


def packed_size_bytes(count: int | tf.Tensor, width: int) -> int | tf.Tensor:
    """Bytes that ``count`` symbols of ``width`` bits occupy once packed (rounded up to a byte)."""
    return (count * width + 7) // 8


def pack_bits(symbols: tf.Tensor, width: int) -> tf.Tensor:
    """Pack a 1-D int32 tensor of ``width``-bit symbols into a 1-D uint8 tensor.

    Each symbol must lie in ``[0, 2**width)``; for width 32 it is the raw 32-bit pattern (any
    int32). The last byte is padded with zero bits.
    """
    _check_width(width)
    symbols = tf.reshape(tf.cast(symbols, tf.int32), [-1])
    if width == 0:
        return tf.zeros([0], tf.uint8)
    if width in _BYTE_ALIGNED_DTYPES:
        narrow = symbols if width == 32 else tf.cast(symbols, _BYTE_ALIGNED_DTYPES[width])
        return tf.reshape(tf.bitcast(narrow, tf.uint8), [-1])
    shifts = tf.range(width, dtype=tf.int32)
    bits = tf.bitwise.bitwise_and(tf.bitwise.right_shift(symbols[:, tf.newaxis], shifts), 1)
    bits = tf.reshape(bits, [-1])
    padding = tf.math.floormod(-tf.size(bits), 8)
    bits = tf.reshape(tf.pad(bits, [[0, padding]]), [-1, 8])
    byte_values = tf.reduce_sum(tf.bitwise.left_shift(bits, tf.range(8, dtype=tf.int32)), axis=1)
    return tf.cast(byte_values, tf.uint8)


def unpack_bits(packed: tf.Tensor, count: int | tf.Tensor, width: int) -> tf.Tensor:
    """Inverse of :func:`pack_bits` for one packed run: the first ``count`` symbols as int32."""
    return unpack_rows(tf.reshape(packed, [1, -1]), count, width)[0]


def unpack_rows(packed: tf.Tensor, count: int | tf.Tensor, width: int) -> tf.Tensor:
    """Unpack the first ``count`` symbols of every row of a uint8 matrix [rows, bytes].

    For payload sections that sit at the same place, with the same length, in every rank's
    buffer: one reshape instead of a gather per symbol.
    """
    _check_width(width)
    packed = tf.cast(packed, tf.uint8)
    rows = tf.shape(packed)[0]
    if width == 0:
        return tf.zeros([rows, count], tf.int32)
    if width in _BYTE_ALIGNED_DTYPES:
        bytes_per_symbol = width // 8
        raw = tf.reshape(packed[:, : count * bytes_per_symbol], [rows, -1, bytes_per_symbol])
        if width == 8:
            return tf.cast(raw[:, :, 0], tf.int32)
        narrow = tf.bitcast(raw, _BYTE_ALIGNED_DTYPES[width])
        return narrow if width == 32 else tf.cast(narrow, tf.int32)
    used = packed[:, : (count * width + 7) // 8]
    bits = tf.bitwise.bitwise_and(
        tf.bitwise.right_shift(tf.cast(used, tf.int32)[:, :, tf.newaxis], tf.range(8)), 1
    )
    bits = tf.reshape(tf.reshape(bits, [rows, -1])[:, : count * width], [rows, -1, width])
    return tf.reduce_sum(tf.bitwise.left_shift(bits, tf.range(width, dtype=tf.int32)), axis=2)


def read_bits(
    buffer: tf.Tensor, start_bytes: tf.Tensor, counts: tf.Tensor, width: int
) -> tf.Tensor:
    """Read several packed runs out of one byte buffer at once.

    Run ``r`` starts at byte ``start_bytes[r]`` of ``buffer`` and holds ``counts[r]`` symbols
    of ``width`` bits. Returns the symbols of all runs concatenated in run order (int32), so
    that a receiver decodes the sections of every rank's payload with one gather.
    """
    _check_width(width)
    start_bytes = tf.cast(tf.reshape(start_bytes, [-1]), tf.int64)
    counts = tf.cast(tf.reshape(counts, [-1]), tf.int64)
    if width == 0:
        return tf.zeros([tf.reduce_sum(counts)], tf.int32)
    if width in _BYTE_ALIGNED_DTYPES:
        bytes_per_symbol = width // 8
        positions = tf.ragged.range(
            start_bytes, start_bytes + counts * bytes_per_symbol
        ).flat_values
        raw = tf.reshape(tf.gather(buffer, positions), [-1, bytes_per_symbol])
        if width == 8:
            return tf.cast(raw[:, 0], tf.int32)
        narrow = tf.bitcast(raw, _BYTE_ALIGNED_DTYPES[width])
        return narrow if width == 32 else tf.cast(narrow, tf.int32)
    first_bit = start_bytes * 8
    bit_positions = tf.ragged.range(first_bit, first_bit + counts * width).flat_values
    containing_bytes = tf.cast(
        tf.gather(buffer, tf.bitwise.right_shift(bit_positions, 3)), tf.int32
    )
    bit_in_byte = tf.cast(tf.bitwise.bitwise_and(bit_positions, 7), tf.int32)
    bits = tf.bitwise.bitwise_and(tf.bitwise.right_shift(containing_bytes, bit_in_byte), 1)
    bits = tf.reshape(bits, [-1, width])
    return tf.reduce_sum(tf.bitwise.left_shift(bits, tf.range(width, dtype=tf.int32)), axis=1)


def _check_width(width: int) -> None:
    if not isinstance(width, int) or isinstance(width, bool) or not 0 <= width <= 32:
        raise ValueError(f"width={width!r} is out of range; allowed: integers in [0, 32]")
