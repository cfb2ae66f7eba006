"""TFRecord shards: round trip, per-rank files, equal steps with uneven shards, bad files."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from globaldl.pipelines import DATASET_NAMES, ShardFileError, make_pipeline


def _batches(dataset: tf.data.Dataset) -> list[tuple[np.ndarray, np.ndarray]]:
    return [(images.numpy(), labels.numpy()) for images, labels in dataset]


def _rows(batches: list[tuple[np.ndarray, np.ndarray]]) -> list[bytes]:
    return sorted(
        image.tobytes() + bytes([label])
        for images, labels in batches
        for image, label in zip(images, labels, strict=True)
    )


def test_tfrecord_round_trip_gives_exactly_the_in_memory_batches(tmp_path: Path) -> None:
    for rank in range(2):
        from_disk = make_pipeline(
            "digits", rank=rank, num_ranks=2, batch_size=64, seed=0, data_dir=tmp_path
        )
        in_memory = make_pipeline("digits", rank=rank, num_ranks=2, batch_size=64, seed=0)
        assert from_disk.steps_per_epoch == in_memory.steps_per_epoch
        for epoch in (0, 1):
            disk_batches = _batches(from_disk.train_batches(epoch))
            memory_batches = _batches(in_memory.train_batches(epoch))
            assert len(disk_batches) == len(memory_batches) == in_memory.steps_per_epoch
            for disk, memory in zip(disk_batches, memory_batches, strict=True):
                assert disk[0].dtype == np.float32 and disk[1].dtype == np.int32
                assert np.array_equal(disk[0], memory[0]) and np.array_equal(disk[1], memory[1])
        resumed = _batches(from_disk.train_batches(1, skip_batches=5))
        assert all(
            np.array_equal(disk[0], memory[0]) and np.array_equal(disk[1], memory[1])
            for disk, memory in zip(resumed, memory_batches[5:], strict=True)
        )
        # validation comes in file order from disk: same examples, same count
        disk_validation = _batches(from_disk.validation_batches())
        assert _rows(disk_validation) == _rows(_batches(in_memory.validation_batches()))
        assert sum(len(labels) for _, labels in disk_validation) == 180


@pytest.mark.parametrize("name", DATASET_NAMES)
def test_tfrecord_round_trip_keeps_every_dataset_shape_exactly(name: str, tmp_path: Path) -> None:
    from_disk = make_pipeline(name, rank=3, num_ranks=4, batch_size=50, seed=0, data_dir=tmp_path)
    in_memory = make_pipeline(name, rank=3, num_ranks=4, batch_size=50, seed=0)
    disk_batches = _batches(from_disk.train_batches(epoch=0))
    memory_batches = _batches(in_memory.train_batches(epoch=0))
    assert len(disk_batches) == len(memory_batches) == in_memory.steps_per_epoch
    assert disk_batches[0][0].shape == (50, *in_memory.spec.input_shape)
    for disk, memory in zip(disk_batches, memory_batches, strict=True):
        assert np.array_equal(disk[0], memory[0]) and np.array_equal(disk[1], memory[1])


def test_tfrecord_steps_identical_on_every_rank_with_uneven_shard_counts(tmp_path: Path) -> None:
    pipelines = [
        make_pipeline("digits", rank=rank, num_ranks=3, batch_size=32, seed=0, data_dir=tmp_path)
        for rank in range(3)
    ]
    manifest = json.loads((tmp_path / "digits-seed0" / "manifest.json").read_text())
    counts = [entry["records"] for entry in manifest["splits"]["train"]]
    assert manifest["num_shards"] == 8 and sum(counts) == 1437
    # rank r reads shard files r, r + 3, r + 6: 539, 539 and 359 records
    per_rank = [sum(counts[rank::3]) for rank in range(3)]
    assert per_rank == [539, 539, 359]
    assert [pipeline.train_examples for pipeline in pipelines] == per_rank
    for pipeline in pipelines:
        assert pipeline.steps_per_epoch == 359 // 32
        assert len(_batches(pipeline.train_batches(epoch=2))) == 359 // 32
    validation_total = sum(
        len(labels)
        for pipeline in pipelines
        for _, labels in _batches(pipeline.validation_batches())
    )
    assert validation_total == 360


def test_tfrecord_ranks_cover_every_training_example_once(tmp_path: Path) -> None:
    seen: list[bytes] = []
    for rank in range(3):
        pipeline = make_pipeline(
            "digits", rank=rank, num_ranks=3, batch_size=1, seed=0, data_dir=tmp_path
        )
        epoch = _batches(pipeline.train_batches(epoch=0))
        assert len(epoch) == 359  # every rank stops at the smallest rank's count
        seen += _rows(epoch)
    # ranks 0 and 1 own 180 records more than they may use; the rest is disjoint
    memory = make_pipeline("digits", rank=0, num_ranks=1, batch_size=1437, seed=0)
    everything = _rows(_batches(memory.train_batches(epoch=0)))
    assert set(seen) <= set(everything)
    assert len(seen) == 3 * 359


def test_each_rank_writes_only_the_shard_files_it_reads(tmp_path: Path) -> None:
    make_pipeline("digits", rank=1, num_ranks=3, batch_size=32, seed=0, data_dir=tmp_path)
    directory = tmp_path / "digits-seed0"
    assert sorted(path.name for path in directory.iterdir()) == [
        "manifest.json",
        *(f"train-0000{shard}-of-00008.tfrecord" for shard in (1, 4, 7)),
        *(f"validation-0000{shard}-of-00008.tfrecord" for shard in (1, 4, 7)),
    ]  # and no temporary file is left behind


def test_existing_shards_are_checked_and_reused_not_rewritten(tmp_path: Path) -> None:
    make_pipeline("digits", rank=0, num_ranks=2, batch_size=32, seed=0, data_dir=tmp_path)
    shard = tmp_path / "digits-seed0" / "train-00000-of-00008.tfrecord"
    written = shard.stat()
    again = make_pipeline("digits", rank=0, num_ranks=2, batch_size=32, seed=0, data_dir=tmp_path)
    assert shard.stat().st_ino == written.st_ino and shard.stat().st_mtime_ns == written.st_mtime_ns
    assert len(_batches(again.train_batches(0))) == again.steps_per_epoch


def _corrupt_middle_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def test_corrupted_shard_fails_at_start_naming_the_file_and_record(tmp_path: Path) -> None:
    make_pipeline("mnist", rank=0, num_ranks=1, batch_size=32, seed=0, data_dir=tmp_path)
    shard = tmp_path / "mnist-seed0" / "train-00005-of-00008.tfrecord"
    _corrupt_middle_byte(shard)
    with pytest.raises(ShardFileError) as failure:
        make_pipeline("mnist", rank=0, num_ranks=1, batch_size=32, seed=0, data_dir=tmp_path)
    assert str(shard) in str(failure.value)
    assert failure.value.readable_records == 250  # the flipped byte is in record 250 of 500
    assert "record 250" in str(failure.value)
    assert isinstance(failure.value, ValueError)


def test_truncated_shard_fails_at_start_naming_the_file(tmp_path: Path) -> None:
    make_pipeline("digits", rank=0, num_ranks=2, batch_size=32, seed=0, data_dir=tmp_path)
    shard = tmp_path / "digits-seed0" / "validation-00002-of-00008.tfrecord"
    shard.write_bytes(shard.read_bytes()[:-100])
    with pytest.raises(ValueError, match="validation-00002-of-00008.tfrecord"):
        make_pipeline("digits", rank=0, num_ranks=2, batch_size=32, seed=0, data_dir=tmp_path)


def test_shard_damaged_during_training_fails_naming_the_file(tmp_path: Path) -> None:
    pipeline = make_pipeline(
        "digits", rank=0, num_ranks=1, batch_size=32, seed=0, data_dir=tmp_path
    )
    shard = tmp_path / "digits-seed0" / "train-00003-of-00008.tfrecord"
    _corrupt_middle_byte(shard)
    with pytest.raises(tf.errors.InvalidArgumentError, match="train-00003-of-00008.tfrecord"):
        _batches(pipeline.train_batches(epoch=0))
    shard.write_bytes(b"")  # a file emptied completely is caught too
    with pytest.raises(tf.errors.InvalidArgumentError, match="0 records are readable"):
        _batches(pipeline.train_batches(epoch=0))


def test_manifest_of_other_data_fails_clearly(tmp_path: Path) -> None:
    make_pipeline("digits", rank=0, num_ranks=1, batch_size=32, seed=0, data_dir=tmp_path)
    manifest_path = tmp_path / "digits-seed0" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["content_sha256"] = "0" * 64  # as if written by another version of the generator
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match="belongs to other data: its content_sha256"):
        make_pipeline("digits", rank=0, num_ranks=1, batch_size=32, seed=0, data_dir=tmp_path)
    manifest["format_version"] = 99
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match="format_version"):
        make_pipeline("digits", rank=0, num_ranks=1, batch_size=32, seed=0, data_dir=tmp_path)


def test_more_ranks_than_existing_shards_fails_clearly(tmp_path: Path) -> None:
    make_pipeline("digits", rank=0, num_ranks=2, batch_size=32, seed=0, data_dir=tmp_path)
    with pytest.raises(ValueError, match="8 shards per split, fewer than the 9 ranks"):
        make_pipeline("digits", rank=0, num_ranks=9, batch_size=32, seed=0, data_dir=tmp_path)


def test_many_ranks_get_one_shard_file_each(tmp_path: Path) -> None:
    pipeline = make_pipeline(
        "digits", rank=10, num_ranks=12, batch_size=8, seed=0, data_dir=tmp_path
    )
    manifest = json.loads((tmp_path / "digits-seed0" / "manifest.json").read_text())
    assert manifest["num_shards"] == 12
    assert pipeline.steps_per_epoch == (1437 // 12) // 8
