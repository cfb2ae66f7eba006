"""Integer lanes a sum of N ranks' codes cannot overflow, and the words that carry them.

The arithmetic of ``LaneSum`` (`summable.py`) without TensorFlow, so that the simulator can
tell what an integer-sum payload weighs at any number of ranks: a lane of w bits holds the sum
of N codes in [0, 2L] when 2 L N < 2**w; lanes are packed into the narrowest word Horovod can
allreduce.
"""

from __future__ import annotations

import math

MIN_LANE_BITS, MAX_LANE_BITS = 2, 16

WORD_TYPES: tuple[tuple[str, int, int], ...] = (
    ("uint8", 8, 8),  # unsigned: all 8 bits hold lanes (sums wrap modulo 256; ours never reach it)
    ("int32", 31, 32),  # signed: the top bit stays clear
    ("int64", 63, 64),
)
"""(dtype, bits that may hold lanes, bits per word) of the integer types Horovod sums."""


def lane_word(lane_bits: int) -> tuple[str, int]:
    """The word dtype carrying lanes of ``lane_bits`` in the fewest bytes, and lanes per word."""
    options = [
        (word_bits / (usable // lane_bits), word_bits, name, usable // lane_bits)
        for name, usable, word_bits in WORD_TYPES
        if usable // lane_bits >= 1
    ]
    if not options:
        raise ValueError(f"sum_bits={lane_bits} does not fit any summable integer word")
    _, _, name, lanes = min(options)
    return name, lanes


def max_ranks(lane_bits: int) -> int:
    """The most ranks lanes of ``lane_bits`` can sum: each rank needs at least L = 1."""
    return (2**lane_bits - 1) // 2


def levels_for(lane_bits: int, num_ranks: int) -> int:
    """L: codes per rank lie in [-L, L], so that N ranks' codes sum below 2**lane_bits."""
    if not 1 <= num_ranks <= max_ranks(lane_bits):
        raise ValueError(
            f"{num_ranks} ranks cannot sum {lane_bits}-bit lanes without overflow; "
            f"sum_bits={lane_bits} supports 1..{max_ranks(lane_bits)} ranks "
            f"(sum_bits 12 supports {max_ranks(12)}, 16 supports {max_ranks(16)})"
        )
    return (2**lane_bits - 1) // (2 * num_ranks)


def lane_bits_for(num_ranks: int, at_least: int = MIN_LANE_BITS) -> int:
    """The narrowest lanes (at least ``at_least`` bits) whose sums ``num_ranks`` ranks fit."""
    for lane_bits in range(max(at_least, MIN_LANE_BITS), MAX_LANE_BITS + 1):
        if max_ranks(lane_bits) >= num_ranks:
            return lane_bits
    raise ValueError(
        f"{num_ranks} ranks cannot sum integer codes in lanes of at most {MAX_LANE_BITS} bits "
        f"(they sum at most {max_ranks(MAX_LANE_BITS)} ranks)"
    )


def word_bytes(lane_bits: int) -> int:
    """Bytes of the word ``lane_word`` packs lanes of ``lane_bits`` into."""
    dtype, _ = lane_word(lane_bits)
    return next(bits for name, _, bits in WORD_TYPES if name == dtype) // 8


def packed_bytes(num_lanes: int, lane_bits: int) -> int:
    """Bytes of ``num_lanes`` lanes of ``lane_bits`` packed into words (``lane_word``)."""
    _, lanes_per_word = lane_word(lane_bits)
    return math.ceil(num_lanes / lanes_per_word) * word_bytes(lane_bits)
