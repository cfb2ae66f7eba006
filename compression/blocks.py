"""Which quantisation block each kept value of a pruned tensor belongs to.

Quantizers with a scale (int8, qsgd, terngrad, sign) share one scale per block of
``block_size`` sent values. For the entries that pruning kept, blocks restart at every tensor
(and every rank): a layer with large gradients then never crushes the resolution of a
neighbouring layer with small ones, which matters most there because top-k keeps each layer's
extremes. Sender and receiver derive the same blocks from the kept positions alone; nothing
about blocks is transmitted except the scales. (Entries sent dense are blocked as one
consecutive vector instead, which costs a reshape rather than a gather per value; see
Quantizer.quantize.)
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import tensorflow as tf


class BlockLayout(NamedTuple):
    """Blocks of a run of sent values (or of several ranks' runs, concatenated)."""

    block_ids: tf.Tensor  # int32 [num_values]: block of each value, numbered across all runs
    index_in_block: tf.Tensor  # int32 [num_values]: 0 .. block_size - 1
    blocks_per_run: tf.Tensor  # int64 [num_runs]: how many blocks (so scales) each run has
    num_blocks: tf.Tensor  # int32 scalar: total


def block_layout(
    positions: tf.Tensor,
    run_ids: tf.Tensor,
    num_runs: int | tf.Tensor,
    tensor_starts: np.ndarray,
    block_size: int,
) -> BlockLayout:
    """Blocks for sent values given their flat positions, in sending order.

    Args:
        positions: int32 flat positions of the sent values; ascending within each run.
        run_ids: int32 run (rank) of each value; non-decreasing.
        num_runs: number of runs.
        tensor_starts: first flat position of each tensor, ascending (static).
        block_size: values per block within one tensor.

    """
    positions = tf.reshape(tf.cast(positions, tf.int32), [-1])
    run_ids = tf.reshape(tf.cast(run_ids, tf.int32), [-1])
    starts = tf.constant(np.asarray(tensor_starts, np.int32))
    tensor_of_value = tf.searchsorted(starts, positions, side="right") - 1
    starts_new_run = tf.logical_or(
        tf.not_equal(tensor_of_value[1:], tensor_of_value[:-1]),
        tf.not_equal(run_ids[1:], run_ids[:-1]),
    )
    first = tf.ones([tf.minimum(tf.size(positions), 1)], tf.bool)
    run_start = tf.concat([first, starts_new_run], axis=0)
    # Index of the first value of each tensor's run, spread to every value of that run.
    run_first_value = tf.cast(tf.where(run_start)[:, 0], tf.int32)
    run_number = tf.cumsum(tf.cast(run_start, tf.int32)) - 1
    index = tf.range(tf.size(positions), dtype=tf.int32)
    index_in_run = index - tf.gather(run_first_value, run_number)
    index_in_block = tf.math.floormod(index_in_run, block_size)
    block_start = tf.equal(index_in_block, 0)
    block_ids = tf.cumsum(tf.cast(block_start, tf.int32)) - 1
    blocks_per_run = tf.math.unsorted_segment_sum(tf.cast(block_start, tf.int64), run_ids, num_runs)
    num_blocks = tf.reduce_sum(tf.cast(block_start, tf.int32))
    return BlockLayout(block_ids, index_in_block, blocks_per_run, num_blocks)


def static_block_count(kept_per_tensor: list[int], block_size: int) -> int:
    """Number of blocks when the per-tensor kept counts are known at trace time."""
    return sum(-(-count // block_size) for count in kept_per_tensor)
