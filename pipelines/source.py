"""The interface between an input pipeline and where one rank's examples are stored."""

from __future__ import annotations

import abc

import numpy as np
import tensorflow as tf

from globaldl.pipelines.spec import DatasetSpec


class ExampleSource(abc.ABC):
    """One rank's share of a dataset, served as ``uint8`` image batches and ``int32`` labels.

    A subclass says which training examples each rank owns and serves them in a given order;
    the pipeline (``InputPipeline``) decides the order, scales pixels and adds prefetching.
    Subclasses override:

    * ``train_examples_per_rank``: how many training examples every rank owns (the pipeline
      takes the minimum so that every rank runs the same number of steps);
    * ``rank_train_indices``: the global indices (positions in the training split) this
      rank owns, ascending;
    * ``ordered_train_batches(ordered_indices, batch_size)``: exactly those examples, in that
      order, as full batches;
    * ``validation_examples`` and ``validation_batches(batch_size)``: how many validation
      examples this rank evaluates, and those examples in a fixed order;
    * optionally ``prepare()``: one-off work after the arguments were validated (writing files).

    The two implementations are ``InMemorySource`` (memory.py) and ``TFRecordSource``
    (tfrecords.py); they must serve identical batches for the same ordered indices.
    """

    def __init__(self, spec: DatasetSpec, rank: int, num_ranks: int) -> None:
        self.spec = spec
        self.rank = rank
        self.num_ranks = num_ranks

    @property
    @abc.abstractmethod
    def train_examples_per_rank(self) -> tuple[int, ...]:
        """Training examples owned by rank 0, 1, ..., num_ranks - 1."""

    @property
    @abc.abstractmethod
    def rank_train_indices(self) -> np.ndarray:
        """Global training indices owned by this rank, ascending."""

    @property
    @abc.abstractmethod
    def validation_examples(self) -> int:
        """Validation examples served to this rank."""

    @abc.abstractmethod
    def ordered_train_batches(
        self, ordered_indices: np.ndarray, batch_size: int
    ) -> tf.data.Dataset:
        """Batches of (uint8 images, int32 labels) of exactly ``ordered_indices``, in order.

        ``len(ordered_indices)`` is a non-zero multiple of ``batch_size``; every index is one
        of ``rank_train_indices``.
        """

    @abc.abstractmethod
    def validation_batches(self, batch_size: int) -> tf.data.Dataset:
        """Validation examples of this rank as (uint8 images, int32 labels) batches."""

    def prepare(self) -> None:  # noqa: B027  (optional hook, deliberately empty by default)
        """One-off work once the pipeline's arguments are known to be valid; none by default."""

    def element_spec(self, batch_size: int | None) -> tuple[tf.TensorSpec, tf.TensorSpec]:
        """The (images, labels) spec of one batch before scaling."""
        return (
            tf.TensorSpec((batch_size, *self.spec.input_shape), tf.uint8),
            tf.TensorSpec((batch_size,), tf.int32),
        )
