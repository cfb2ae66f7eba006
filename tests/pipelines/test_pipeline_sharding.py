"""Seeded epoch order, rank shards, equal steps on every rank, resuming, and the input delay."""

from __future__ import annotations

import time

import numpy as np
import pytest
import tensorflow as tf

from globaldl.pipelines import load_arrays, make_pipeline


def _batches(dataset: tf.data.Dataset) -> list[tuple[np.ndarray, np.ndarray]]:
    return [(images.numpy(), labels.numpy()) for images, labels in dataset]


def _example_ids(
    name: str, batches: list[tuple[np.ndarray, np.ndarray]], split: str, seed: int = 0
) -> list[int]:
    """Map every example of ``batches`` back to its index in the split, via its exact pixels."""
    arrays = load_arrays(name, seed)
    index_of = {row.tobytes(): index for index, row in enumerate(arrays.images(split))}
    ids = []
    for images, labels in batches:
        for image, label in zip(images, labels, strict=True):
            index = index_of[np.round(image * arrays.pixel_max).astype(np.uint8).tobytes()]
            assert arrays.labels(split)[index] == label
            ids.append(index)
    return ids


def test_same_seed_and_epoch_give_identical_batches_and_another_epoch_another_order() -> None:
    first = make_pipeline("mnist", rank=1, num_ranks=2, batch_size=100, seed=3)
    second = make_pipeline("mnist", rank=1, num_ranks=2, batch_size=100, seed=3)
    epoch_two = _batches(first.train_batches(epoch=2))
    again = _batches(second.train_batches(epoch=2))
    assert all(
        np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
        for a, b in zip(epoch_two, again, strict=True)
    )
    epoch_three_ids = _example_ids("mnist", _batches(first.train_batches(epoch=3)), "train", 3)
    epoch_two_ids = _example_ids("mnist", epoch_two, "train", 3)
    assert epoch_three_ids != epoch_two_ids
    assert sorted(epoch_three_ids) == sorted(epoch_two_ids)  # same shard, new order


def test_another_seed_gives_another_order() -> None:
    seed_three = make_pipeline("digits", rank=0, num_ranks=1, batch_size=50, seed=3)
    seed_four = make_pipeline("digits", rank=0, num_ranks=1, batch_size=50, seed=4)
    _, labels_three = next(iter(seed_three.train_batches(0)))
    _, labels_four = next(iter(seed_four.train_batches(0)))
    assert not np.array_equal(labels_three.numpy(), labels_four.numpy())


def test_rank_shards_are_disjoint_and_cover_the_training_split() -> None:
    shards = [
        set(
            _example_ids(
                "mnist",
                _batches(
                    make_pipeline(
                        "mnist", rank=rank, num_ranks=2, batch_size=100, seed=0
                    ).train_batches(epoch=1)
                ),
                "train",
            )
        )
        for rank in range(2)
    ]
    assert len(shards[0]) == len(shards[1]) == 2000
    assert not shards[0] & shards[1]
    assert shards[0] | shards[1] == set(range(4000))


# (5, 144): ranks own 288 or 287 examples, so 2 batches would fit on some ranks, 1 on others
@pytest.mark.parametrize("num_ranks,batch_size", [(2, 64), (5, 7), (5, 144), (7, 100)])
def test_steps_per_epoch_identical_on_every_rank_with_uneven_shards(
    num_ranks: int, batch_size: int
) -> None:
    pipelines = [
        make_pipeline("digits", rank=rank, num_ranks=num_ranks, batch_size=batch_size, seed=0)
        for rank in range(num_ranks)
    ]
    shard_sizes = {pipeline.train_examples for pipeline in pipelines}
    assert len(shard_sizes) == 2  # 1437 examples never split evenly over these rank counts
    expected_steps = min(shard_sizes) // batch_size
    for pipeline in pipelines:
        assert pipeline.steps_per_epoch == expected_steps
        assert len(_batches(pipeline.train_batches(epoch=0))) == expected_steps


def test_skip_batches_resumes_at_the_right_batch() -> None:
    pipeline = make_pipeline("digits", rank=1, num_ranks=2, batch_size=32, seed=5)
    whole_epoch = _batches(pipeline.train_batches(epoch=4))
    resumed = _batches(pipeline.train_batches(epoch=4, skip_batches=7))
    assert len(resumed) == pipeline.steps_per_epoch - 7
    for expected, actual in zip(whole_epoch[7:], resumed, strict=True):
        assert np.array_equal(expected[0], actual[0]) and np.array_equal(expected[1], actual[1])
    assert _batches(pipeline.train_batches(epoch=4, skip_batches=pipeline.steps_per_epoch)) == []


def test_validation_shards_are_disjoint_cover_the_split_and_keep_a_fixed_order() -> None:
    ids = []
    for rank in range(3):
        pipeline = make_pipeline("digits", rank=rank, num_ranks=3, batch_size=50, seed=0)
        batches = _batches(pipeline.validation_batches())
        assert len(batches[-1][1]) == pipeline.validation_examples % 50  # partial last batch
        rank_ids = _example_ids("digits", batches, "validation")
        assert rank_ids == _example_ids(
            "digits", _batches(pipeline.validation_batches()), "validation"
        )
        assert rank_ids == sorted(rank_ids)  # not shuffled
        ids += rank_ids
    assert sorted(ids) == list(range(360))


def test_input_delay_adds_its_sleep_to_every_batch() -> None:
    delay_ms = 40.0
    slow = make_pipeline(
        "digits", rank=0, num_ranks=1, batch_size=100, seed=0, input_delay_ms=delay_ms
    )
    started = time.perf_counter()
    batch_count = len(_batches(slow.train_batches(epoch=0)))
    elapsed_seconds = time.perf_counter() - started
    assert batch_count == 14
    assert elapsed_seconds >= batch_count * delay_ms / 1000


def test_zero_input_delay_adds_no_operation_to_the_graph() -> None:
    def graph_ops(input_delay_ms: float) -> bytes:
        pipeline = make_pipeline(
            "digits", rank=0, num_ranks=1, batch_size=100, seed=0, input_delay_ms=input_delay_ms
        )
        dataset = pipeline.train_batches(epoch=0)
        policy = tf.data.experimental.ExternalStatePolicy.IGNORE
        return dataset._as_serialized_graph(external_state_policy=policy).numpy()

    assert b"EagerPyFunc" not in graph_ops(0.0)
    assert b"EagerPyFunc" in graph_ops(5.0)
