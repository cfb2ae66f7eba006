"""Materialise a dataset as sharded TFRecord files with a manifest, and serve a rank's shards.

On-disk layout, under ``<data_dir>/<name>-seed<seed>/``::

    manifest.json                       format version, spec, seed, content hash, shard counts
    train-00000-of-00008.tfrecord       training examples i with i % 8 == 0, ascending
    ...
    validation-00007-of-00008.tfrecord  validation examples i with i % 8 == 7, ascending

Each record is a ``tf.train.Example`` with ``image`` (the raw ``uint8`` bytes of one example,
C order, shape ``spec.input_shape``), ``label`` (int64) and ``index`` (int64, the example's
position in its split; it lets every rank put its examples in the seeded epoch order
whatever the file order is). Rank ``r`` of ``R`` reads shard files ``r, r + R, r + 2R, ...``
of each split and writes only those, so ranks sharing one disk never write the same file;
every file, and the manifest, is written to a temporary name in the same directory and then
renamed into place, so a reader never sees half a file.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import tensorflow as tf

from globaldl.files import atomic_path, write_json_atomically
from globaldl.pipelines.datasets import content_sha256
from globaldl.pipelines.sharding import strided_indices
from globaldl.pipelines.source import ExampleSource
from globaldl.pipelines.spec import DatasetArrays

FORMAT_VERSION = 1
MIN_SHARDS = 8
MANIFEST_NAME = "manifest.json"
SPLITS = ("train", "validation")
_RECORD_FEATURES = {
    "image": tf.io.FixedLenFeature([], tf.string),
    "label": tf.io.FixedLenFeature([], tf.int64),
    "index": tf.io.FixedLenFeature([], tf.int64),
}


class ShardFileError(ValueError):
    """A shard file on disk does not hold the records its manifest lists."""

    def __init__(self, path: Path, readable_records: int, expected_records: int) -> None:
        self.path = path
        self.readable_records = readable_records
        self.expected_records = expected_records
        if readable_records < expected_records:
            problem = (
                f"is corrupted or truncated: record {readable_records} (0-based) cannot be "
                f"read, and the manifest lists {expected_records} records"
            )
        else:
            problem = f"holds {readable_records} records but the manifest lists {expected_records}"
        super().__init__(
            f"TFRecord shard {path} {problem}; delete the file to have it written again"
        )


def dataset_directory(data_dir: Path, name: str, seed: int) -> Path:
    """Where dataset ``name`` for ``seed`` is materialised under ``data_dir``."""
    return Path(data_dir) / f"{name}-seed{seed}"


def shard_file_name(split: str, shard: int, num_shards: int) -> str:
    """File name of one shard, e.g. ``train-00003-of-00008.tfrecord``."""
    return f"{split}-{shard:05d}-of-{num_shards:05d}.tfrecord"


class TFRecordSource(ExampleSource):
    """Serve a rank's examples from TFRecord shard files, reading them from disk every epoch.

    Construction reads (or writes) the manifest; ``prepare()`` writes this rank's missing
    shard files and checks the existing ones record by record. An epoch reads this rank's
    shard files, parses them, puts the records in the epoch order and batches them, so the
    data-loading time measured by the trainer includes real file I/O. If a file turns out
    unreadable during an epoch, the iterator fails with an error naming the file.
    """

    def __init__(
        self, arrays: DatasetArrays, data_dir: Path, seed: int, rank: int, num_ranks: int
    ) -> None:
        super().__init__(arrays.spec, rank, num_ranks)
        self._arrays = arrays
        self.directory = dataset_directory(data_dir, arrays.spec.name, seed)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.manifest = _open_manifest(self.directory, arrays, seed, num_ranks)
        self.num_shards: int = self.manifest["num_shards"]
        self._rank_shards = range(rank, self.num_shards, num_ranks)
        self._records = {
            split: [entry["records"] for entry in self.manifest["splits"][split]]
            for split in SPLITS
        }

    @property
    def train_examples_per_rank(self) -> tuple[int, ...]:
        """Training records in the shard files of each rank (from the manifest)."""
        counts = self._records["train"]
        return tuple(sum(counts[rank :: self.num_ranks]) for rank in range(self.num_ranks))

    @property
    def rank_train_indices(self) -> np.ndarray:
        """Global training indices stored in this rank's shard files, ascending."""
        return np.sort(
            np.concatenate(
                [
                    strided_indices(self.spec.train_size, shard, self.num_shards)
                    for shard in self._rank_shards
                ]
                or [np.empty(0, dtype=np.int64)]
            )
        )

    @property
    def validation_examples(self) -> int:
        """Validation records in this rank's validation shard files."""
        return sum(self._records["validation"][self.rank :: self.num_ranks])

    def shard_paths(self, split: str) -> list[Path]:
        """Shard files of ``split`` that this rank reads, in reading order."""
        return [
            self.directory / shard_file_name(split, shard, self.num_shards)
            for shard in self._rank_shards
        ]

    def prepare(self) -> None:
        """Write this rank's missing shard files; check that existing ones match the manifest."""
        for split in SPLITS:
            for shard in self._rank_shards:
                path = self.directory / shard_file_name(split, shard, self.num_shards)
                expected_records = self._records[split][shard]
                if path.exists():
                    readable_records = count_readable_records(path)
                    if readable_records != expected_records:
                        raise ShardFileError(path, readable_records, expected_records)
                else:
                    _write_shard_atomically(path, self._arrays, split, shard, self.num_shards)

    def ordered_train_batches(
        self, ordered_indices: np.ndarray, batch_size: int
    ) -> tf.data.Dataset:
        """Read this rank's training shards, keep ``ordered_indices`` in that order, batch."""
        position_of_index = np.full(self.spec.train_size, -1, dtype=np.int64)
        position_of_index[ordered_indices] = np.arange(len(ordered_indices))
        position_table = tf.constant(position_of_index)
        selected_examples = len(ordered_indices)
        owned_examples = self.train_examples_per_rank[self.rank]
        input_shape = self.spec.input_shape

        def arrange(images: tf.Tensor, labels: tf.Tensor, indices: tf.Tensor) -> tf.data.Dataset:
            # Put every selected record at its epoch position; drop the unselected ones
            # (skipped batches and the remainder that does not fill a batch).
            positions = tf.gather(position_table, indices)
            selected = positions >= 0
            positions = tf.boolean_mask(positions, selected)
            in_order = tf.argsort(positions)
            images = tf.gather(tf.boolean_mask(images, selected), in_order)
            labels = tf.gather(tf.boolean_mask(labels, selected), in_order)
            images = tf.reshape(images, (selected_examples // batch_size, batch_size, *input_shape))
            labels = tf.reshape(labels, (selected_examples // batch_size, batch_size))
            return tf.data.Dataset.from_tensor_slices((images, labels))

        records = self._read_split("train").unbatch().batch(owned_examples)
        return records.flat_map(arrange)

    def validation_batches(self, batch_size: int) -> tf.data.Dataset:
        """Validation shards of this rank in file order; the last batch may be partial."""
        records = self._read_split("validation").unbatch().batch(batch_size)
        return records.map(lambda images, labels, indices: (images, labels))

    def _read_split(self, split: str) -> tf.data.Dataset:
        """One element per shard file of this rank: all its (images, labels, indices)."""
        return _read_checked_shards(
            self.shard_paths(split),
            [self._records[split][shard] for shard in self._rank_shards],
            self.spec.input_shape,
        )


def count_readable_records(path: Path) -> int:
    """Records that can be read from the start of ``path`` before the first corrupt one."""
    readable = tf.data.TFRecordDataset(str(path)).ignore_errors()
    return int(readable.reduce(np.int64(0), lambda count, _: count + 1))


def _read_checked_shards(
    paths: list[Path], expected_records: list[int], input_shape: tuple[int, ...]
) -> tf.data.Dataset:
    """Each shard file in turn as one (images, labels, indices) element, checked.

    TensorFlow's own error for a bad record ("corrupted record at 3525") does not name the
    file. Reading each file with ``ignore_errors`` stops at the first bad record, and the
    count check below then fails with the file name and the index of that record.
    """
    files = tf.data.Dataset.from_tensor_slices(
        ([str(path) for path in paths], tf.constant(expected_records, dtype=tf.int64))
    )

    def read_file(path: tf.Tensor, expected: tf.Tensor) -> tf.data.Dataset:
        serialized = tf.data.TFRecordDataset(path).ignore_errors().batch(expected + 1)
        # A file with no readable record yields no batch at all: fall back to an empty batch
        # so that the count check still runs (and fails).
        serialized = serialized.concatenate(
            tf.data.Dataset.from_tensors(tf.zeros([0], dtype=tf.string))
        ).take(1)
        return serialized.map(lambda records: _check_and_parse(records, path, expected))

    def _check_and_parse(
        records: tf.Tensor, path: tf.Tensor, expected: tf.Tensor
    ) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        readable = tf.shape(records, out_type=tf.int64)[0]
        message = tf.strings.format(
            "TFRecord shard {} does not match its manifest: {} records are readable, the "
            "manifest lists {}; the file is corrupted or truncated at record {} (0-based) or "
            "was replaced. Delete it to have it written again.",
            (path, readable, expected, readable),
        )
        check = tf.debugging.Assert(tf.equal(readable, expected), [message], summarize=1)
        with tf.control_dependencies([check]):
            features = tf.io.parse_example(records, _RECORD_FEATURES)
        images = tf.reshape(tf.io.decode_raw(features["image"], tf.uint8), (-1, *input_shape))
        return images, tf.cast(features["label"], tf.int32), features["index"]

    return files.flat_map(read_file)


def _open_manifest(
    directory: Path, arrays: DatasetArrays, seed: int, num_ranks: int
) -> dict[str, Any]:
    """Read the manifest of ``directory`` and check it is for this data, or write a new one."""
    path = directory / MANIFEST_NAME
    if not path.exists():
        manifest = _expected_manifest(arrays, seed, max(MIN_SHARDS, num_ranks))
        write_json_atomically(path, manifest)
        return manifest
    try:
        manifest = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"cannot read TFRecord manifest {path}: {error}") from error
    num_shards = manifest.get("num_shards") if isinstance(manifest, dict) else None
    if not isinstance(num_shards, int) or num_shards < 1:
        raise ValueError(f"TFRecord manifest {path} has no valid num_shards: {num_shards!r}")
    expected = _expected_manifest(arrays, seed, num_shards)
    for key in ("format_version", "dataset", "seed", "pixel_max", "content_sha256", "splits"):
        if manifest.get(key) != expected[key]:
            raise ValueError(
                f"TFRecord manifest {path} belongs to other data: its {key} is "
                f"{_short(manifest.get(key))}, this run needs {_short(expected[key])}. "
                f"Use another --data-dir or delete {directory}."
            )
    if num_shards < num_ranks:
        raise ValueError(
            f"TFRecord manifest {path} has {num_shards} shards per split, fewer than the "
            f"{num_ranks} ranks (each rank needs at least one shard file). "
            f"Use another --data-dir or delete {directory}."
        )
    return manifest


def _expected_manifest(arrays: DatasetArrays, seed: int, num_shards: int) -> dict[str, Any]:
    """The manifest for ``arrays`` cut into ``num_shards`` files per split."""
    spec = arrays.spec
    split_sizes = {"train": spec.train_size, "validation": spec.val_size}
    return {
        "format_version": FORMAT_VERSION,
        "dataset": spec.to_dict(),
        "seed": seed,
        "pixel_max": arrays.pixel_max,
        "content_sha256": content_sha256(spec.name, seed),
        "num_shards": num_shards,
        "record_features": {
            "image": f"bytes: raw uint8, C order, shape {list(spec.input_shape)}",
            "label": "int64",
            "index": "int64: position of the example in its split",
        },
        "splits": {
            split: [
                {
                    "file": shard_file_name(split, shard, num_shards),
                    "records": len(strided_indices(size, shard, num_shards)),
                }
                for shard in range(num_shards)
            ]
            for split, size in split_sizes.items()
        },
    }


def _write_shard_atomically(
    path: Path, arrays: DatasetArrays, split: str, shard: int, num_shards: int
) -> None:
    """Write the examples of one shard to a temporary file, then rename it to ``path``."""
    images = arrays.images(split)
    labels = arrays.labels(split)
    with atomic_path(path) as temporary, tf.io.TFRecordWriter(str(temporary)) as writer:
        for index in strided_indices(len(labels), shard, num_shards):
            writer.write(_serialize(images[index], int(labels[index]), int(index)))


def _serialize(image: np.ndarray, label: int, index: int) -> bytes:
    """One example as a serialized ``tf.train.Example``."""
    feature = {
        "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[image.tobytes()])),
        "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
        "index": tf.train.Feature(int64_list=tf.train.Int64List(value=[index])),
    }
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def _short(value: Any) -> str:
    """A manifest value shortened for an error message."""
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= 160 else text[:157] + "..."
