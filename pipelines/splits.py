"""The seeded, stratified train/validation split shared by the datasets built from real images."""

from __future__ import annotations

import numpy as np


def stratified_split(
    labels: np.ndarray, val_size: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Split example indices into (train, validation) with every class in the same proportion.

    Each class's examples are shuffled by ``rng`` and then dealt round-robin across classes, so
    the first ``val_size`` dealt examples hold every class within one example of
    ``val_size / num_classes`` (as far as a class has examples). Both returned index arrays are
    shuffled (classes interleaved at random), because sharding by rank takes every
    ``num_ranks``-th training example and must not see the classes in blocks.
    """
    if not 0 < val_size < len(labels):
        raise ValueError(f"val_size must be in [1, {len(labels) - 1}], got {val_size}")
    rank_within_class = np.empty(len(labels), dtype=np.int64)
    for label in np.unique(labels):
        members = np.flatnonzero(labels == label)
        rank_within_class[rng.permutation(members)] = np.arange(len(members))
    # Ties (same rank in different classes) are broken at random so no class is favoured.
    dealt = np.lexsort((rng.random(len(labels)), rank_within_class))
    validation = rng.permutation(dealt[:val_size])
    train = rng.permutation(dealt[val_size:])
    return train, validation
