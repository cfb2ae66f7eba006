"""Which examples each rank owns, and the seeded order in which it visits them each epoch."""

from __future__ import annotations

import zlib
from collections.abc import Sequence

import numpy as np

# Separates the epoch-order random stream from the dataset-generation streams of the same seed.
_ORDER_STREAM = zlib.crc32(b"globaldl.pipelines.epoch_order")


def require_rank(rank: int, num_ranks: int) -> None:
    """Raise ValueError unless ``num_ranks >= 1`` and ``0 <= rank < num_ranks``."""
    if not isinstance(num_ranks, int) or isinstance(num_ranks, bool) or num_ranks < 1:
        raise ValueError(f"num_ranks must be an integer >= 1, got {num_ranks!r}")
    if not isinstance(rank, int) or isinstance(rank, bool) or not 0 <= rank < num_ranks:
        raise ValueError(f"rank must be an integer in [0, {num_ranks}), got {rank!r}")


def strided_indices(num_examples: int, part: int, num_parts: int) -> np.ndarray:
    """The examples ``i`` with ``i % num_parts == part``, ascending (one rank's or file's share)."""
    return np.arange(part, num_examples, num_parts, dtype=np.int64)


def proportional_indices(num_examples: int, part: int, shares: Sequence[int]) -> np.ndarray:
    """The examples of ``part`` when ``num_examples`` are split in proportion to ``shares``.

    Within every run of ``sum(shares)`` consecutive examples, part ``i`` owns ``shares[i]``
    of them, after the parts before it; with per-rank batch sizes as ``shares`` every rank
    owns enough examples for the same number of steps. Ascending.
    """
    if not shares or any(not isinstance(share, int) or share < 1 for share in shares):
        raise ValueError(f"shares must be whole numbers >= 1, got {list(shares)!r}")
    if not 0 <= part < len(shares):
        raise ValueError(f"part must be in [0, {len(shares)}), got {part!r}")
    period = sum(shares)
    start = sum(shares[:part])
    offsets = np.arange(num_examples, dtype=np.int64) % period
    return np.flatnonzero((offsets >= start) & (offsets < start + shares[part])).astype(np.int64)


def epoch_order(seed: int, epoch: int, num_examples: int) -> np.ndarray:
    """A permutation of all ``num_examples`` training indices, fixed by (seed, epoch) alone.

    Every rank computes the same global permutation and keeps its own examples in that
    order, so the order does not depend on TensorFlow's global seed, on the number of
    tf.data threads, or on whether the examples come from memory or from TFRecord files.
    """
    rng = np.random.default_rng([seed, _ORDER_STREAM, epoch])
    return rng.permutation(num_examples)


def rank_epoch_order(
    seed: int, epoch: int, num_examples: int, rank_indices: np.ndarray
) -> np.ndarray:
    """A rank's examples (global indices) in the order the rank visits them in ``epoch``."""
    order = epoch_order(seed, epoch, num_examples)
    owned = np.zeros(num_examples, dtype=bool)
    owned[rank_indices] = True
    return order[owned[order]]
