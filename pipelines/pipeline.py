"""One rank's input pipeline: seeded epoch order, equal steps on every rank, tf.data batches."""

from __future__ import annotations

import math
import time
from pathlib import Path

import tensorflow as tf

from globaldl.pipelines.datasets import load_arrays, require_dataset_name, require_seed
from globaldl.pipelines.memory import InMemorySource
from globaldl.pipelines.sharding import rank_epoch_order, require_rank
from globaldl.pipelines.source import ExampleSource
from globaldl.pipelines.spec import DatasetSpec
from globaldl.pipelines.tfrecords import TFRecordSource


class InputPipeline:
    """Batches of one rank's shard of a dataset, for training and for validation.

    Every rank of a run builds its own ``InputPipeline`` with the same arguments except
    ``rank``. The ranks own disjoint shards that together cover the training split, and all
    of them run exactly ``steps_per_epoch`` steps per epoch (set by the smallest shard), so
    collective operations line up step for step.

    Attributes:
        spec: the dataset's spec.
        rank, num_ranks: this rank and the number of ranks of the run.
        seed: the dataset and shuffling seed.
        input_delay_ms: the simulated delay added to every training batch.
        batch_size: examples per batch on this rank (the local batch).
        steps_per_epoch: full batches per epoch, identical on every rank.
        train_examples: training examples this rank owns (some may be left out of an epoch
            when they do not fill a batch, or when another rank owns fewer).
        validation_examples: validation examples this rank evaluates.
        data_dir: the directory of the TFRecord shards, or None when serving from memory.

    With ``rank_batch_sizes`` (one local batch size per rank, from ``--balance speed``) the
    ranks' batches differ; their shards must then be proportional to them (an
    ``InMemorySource`` with those ``shares``) so that every rank still runs the same steps.

    """

    def __init__(
        self,
        source: ExampleSource,
        *,
        batch_size: int,
        seed: int,
        pixel_max: int,
        input_delay_ms: float = 0.0,
        data_dir: Path | None = None,
        rank_batch_sizes: tuple[int, ...] | None = None,
    ) -> None:
        self.spec: DatasetSpec = source.spec
        self.rank = source.rank
        self.num_ranks = source.num_ranks
        self.batch_size = batch_size
        self.seed = seed
        self.input_delay_ms = input_delay_ms
        self.data_dir = data_dir
        self._source = source
        self._pixel_max = pixel_max
        examples_per_rank = source.train_examples_per_rank
        batch_sizes = rank_batch_sizes or (batch_size,) * self.num_ranks
        if len(batch_sizes) != self.num_ranks or batch_sizes[self.rank] != batch_size:
            raise ValueError(
                f"rank_batch_sizes {rank_batch_sizes!r} must hold one batch size per rank "
                f"({self.num_ranks}), with this rank's ({self.rank}) equal to {batch_size}"
            )
        steps = [
            examples // size for examples, size in zip(examples_per_rank, batch_sizes, strict=True)
        ]
        if min(steps) < 1:
            short = steps.index(min(steps))
            raise ValueError(
                f"batch size {batch_sizes[short]} is larger than the "
                f"{examples_per_rank[short]} training examples of rank {short} of "
                f"{self.num_ranks}; at most {examples_per_rank[short]} is possible"
            )
        self.steps_per_epoch = min(steps)
        self.train_examples = examples_per_rank[self.rank]
        self.validation_examples = source.validation_examples
        source.prepare()

    def train_batches(self, epoch: int, skip_batches: int = 0) -> tf.data.Dataset:
        """Training batches of this rank for ``epoch``, from batch ``skip_batches`` on.

        The order is a permutation fixed by (seed, epoch) alone, so a run resumed in the
        middle of an epoch with ``skip_batches`` set to the steps already taken sees exactly
        the batches it would have seen. Yields ``steps_per_epoch - skip_batches`` full
        batches of (float32 images in [0, 1], int32 labels), prefetched.
        """
        if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 0:
            raise ValueError(f"epoch must be an integer >= 0, got {epoch!r}")
        if not isinstance(skip_batches, int) or not 0 <= skip_batches <= self.steps_per_epoch:
            raise ValueError(
                f"skip_batches must be an integer in [0, {self.steps_per_epoch}] "
                f"(steps_per_epoch), got {skip_batches!r}"
            )
        order = rank_epoch_order(
            self.seed, epoch, self.spec.train_size, self._source.rank_train_indices
        )
        selected = order[skip_batches * self.batch_size : self.steps_per_epoch * self.batch_size]
        if len(selected) == 0:
            batches = tf.data.Dataset.from_tensor_slices(
                tuple(
                    tf.zeros((0, *spec.shape), spec.dtype)
                    for spec in self._source.element_spec(self.batch_size)
                )
            )
        else:
            batches = self._source.ordered_train_batches(selected, self.batch_size)
        batches = batches.map(self._scale, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        if self.input_delay_ms > 0:
            # One call at a time: the delay must add up per batch, as slow storage would.
            batches = batches.map(self._delay, num_parallel_calls=1)
        return batches.prefetch(tf.data.AUTOTUNE)

    def validation_batches(self) -> tf.data.Dataset:
        """Validation batches of this rank, in a fixed order; the last batch may be partial."""
        batches = self._source.validation_batches(self.batch_size)
        batches = batches.map(self._scale, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        return batches.prefetch(tf.data.AUTOTUNE)

    def _scale(self, images: tf.Tensor, labels: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        """uint8 pixels to float32 in [0, 1]."""
        return tf.cast(images, tf.float32) / float(self._pixel_max), labels

    def _delay(self, images: tf.Tensor, labels: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        """Pass the batch through after sleeping ``input_delay_ms`` (a simulated slow input)."""
        delay_seconds = self.input_delay_ms / 1000.0

        def sleep() -> int:
            time.sleep(delay_seconds)
            return 0

        slept = tf.py_function(sleep, inp=[], Tout=tf.int32, name="input_delay")
        with tf.control_dependencies([slept]):
            return tf.identity(images), tf.identity(labels)


def make_pipeline(
    name: str,
    *,
    rank: int,
    num_ranks: int,
    batch_size: int,
    seed: int,
    data_dir: Path | None = None,
    input_delay_ms: float = 0.0,
    rank_batch_sizes: tuple[int, ...] | None = None,
) -> InputPipeline:
    """Build rank ``rank``'s input pipeline for dataset ``name`` (one of ``DATASET_NAMES``).

    With ``data_dir`` the dataset is first materialised as TFRecord shards under
    ``data_dir/<name>-seed<seed>/`` (only the shards this rank reads; existing shards are
    checked, not rewritten) and every epoch reads them from disk. Without it, batches come
    from the in-memory arrays. ``input_delay_ms`` adds a sleep per training batch inside
    the tf.data graph (0: no extra operation at all). ``rank_batch_sizes`` gives every rank
    its own local batch (``batch_size`` is this rank's) and each rank a share of the data in
    proportion to it; it needs the in-memory source.
    """
    require_dataset_name(name)
    require_rank(rank, num_ranks)
    require_seed(seed)
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise ValueError(f"batch size must be an integer >= 1, got {batch_size!r}")
    if not isinstance(input_delay_ms, int | float) or not (
        math.isfinite(input_delay_ms) and input_delay_ms >= 0
    ):
        raise ValueError(f"input_delay_ms must be a finite number >= 0, got {input_delay_ms!r}")
    arrays = load_arrays(name, seed)
    source: ExampleSource
    shard_directory: Path | None = None
    if rank_batch_sizes is not None and data_dir is not None:
        raise ValueError(
            "per-rank batch sizes (--balance speed) need the in-memory dataset; drop --data-dir"
        )
    if data_dir is None:
        source = InMemorySource(arrays, rank, num_ranks, shares=rank_batch_sizes)
    else:
        tfrecord_source = TFRecordSource(arrays, Path(data_dir), seed, rank, num_ranks)
        source, shard_directory = tfrecord_source, tfrecord_source.directory
    return InputPipeline(
        source,
        batch_size=batch_size,
        seed=seed,
        pixel_max=arrays.pixel_max,
        input_delay_ms=float(input_delay_ms),
        data_dir=shard_directory,
        rank_batch_sizes=rank_batch_sizes,
    )
