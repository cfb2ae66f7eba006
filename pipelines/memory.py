"""Serve a rank's examples straight from the generated in-memory arrays."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from globaldl.pipelines.sharding import proportional_indices, strided_indices
from globaldl.pipelines.source import ExampleSource
from globaldl.pipelines.spec import DatasetArrays


class InMemorySource(ExampleSource):
    """Rank ``r`` of ``R`` owns examples ``r, r + R, r + 2R, ...`` of each split.

    With ``shares`` (one whole number per rank, e.g. the ranks' local batch sizes) rank ``r``
    owns a share of the training split proportional to ``shares[r]`` instead
    (``proportional_indices``); validation stays strided.

    Only this rank's share is copied into TensorFlow (once, at construction); a batch is one
    ``tf.gather`` of the batch's indices, so an epoch costs no Python work per example.
    """

    def __init__(
        self,
        arrays: DatasetArrays,
        rank: int,
        num_ranks: int,
        shares: tuple[int, ...] | None = None,
    ) -> None:
        super().__init__(arrays.spec, rank, num_ranks)
        if shares is not None and len(shares) != num_ranks:
            raise ValueError(f"shares needs one entry per rank ({num_ranks}), got {shares!r}")
        self._shares = shares
        self._train_indices = self._owned(rank)
        validation_indices = strided_indices(arrays.spec.val_size, rank, num_ranks)
        self._train_images = tf.constant(arrays.train_images[self._train_indices])
        self._train_labels = tf.constant(arrays.train_labels[self._train_indices])
        self._validation_images = tf.constant(arrays.validation_images[validation_indices])
        self._validation_labels = tf.constant(arrays.validation_labels[validation_indices])

    @property
    def train_examples_per_rank(self) -> tuple[int, ...]:
        """Training examples owned by each rank (equal shares: they differ by at most one)."""
        return tuple(len(self._owned(rank)) for rank in range(self.num_ranks))

    def _owned(self, rank: int) -> np.ndarray:
        if self._shares is None:
            return strided_indices(self.spec.train_size, rank, self.num_ranks)
        return proportional_indices(self.spec.train_size, rank, self._shares)

    @property
    def rank_train_indices(self) -> np.ndarray:
        """Global training indices owned by this rank, ascending."""
        return self._train_indices

    @property
    def validation_examples(self) -> int:
        """Validation examples served to this rank."""
        return int(self._validation_labels.shape[0])

    def ordered_train_batches(
        self, ordered_indices: np.ndarray, batch_size: int
    ) -> tf.data.Dataset:
        """Gather each batch of ``ordered_indices`` from this rank's in-memory share."""
        local_indices = np.searchsorted(self._train_indices, ordered_indices)
        batches = tf.data.Dataset.from_tensor_slices(local_indices.reshape(-1, batch_size))
        return batches.map(
            lambda batch: _gather(self._train_images, self._train_labels, batch),
            num_parallel_calls=tf.data.AUTOTUNE,
            deterministic=True,
        )

    def validation_batches(self, batch_size: int) -> tf.data.Dataset:
        """Batch the validation share in index order; the last batch may be partial."""
        batches = tf.data.Dataset.range(self.validation_examples).batch(batch_size)
        return batches.map(
            lambda batch: _gather(self._validation_images, self._validation_labels, batch),
            num_parallel_calls=tf.data.AUTOTUNE,
            deterministic=True,
        )


def _gather(
    images: tf.Tensor, labels: tf.Tensor, indices: tf.Tensor
) -> tuple[tf.Tensor, tf.Tensor]:
    """The (images, labels) rows at ``indices``."""
    return tf.gather(images, indices), tf.gather(labels, indices)
