"""Splitting the global batch by speed, and the weights that keep the update the true mean."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from globaldl import balance
from globaldl.balance import gradient_weight, split_batch
from globaldl.pipelines.sharding import proportional_indices


def test_split_batch_follows_speed() -> None:
    assert split_batch(64, [4.0, 4.0, 1.0, 1.0]) == (26, 26, 6, 6)
    assert split_batch(32, [1.0, 1.0]) == (16, 16)
    assert split_batch(10, [100.0, 1.0, 1.0]) == (8, 1, 1)  # nobody gets nothing


@given(
    st.lists(st.floats(0.01, 1e4), min_size=1, max_size=8),
    st.integers(0, 200),
)
def test_split_batch_sums_to_the_global_batch_with_at_least_one_each(
    speeds: list[float], extra: int
) -> None:
    global_batch = len(speeds) + extra
    sizes = split_batch(global_batch, speeds)
    assert sum(sizes) == global_batch and min(sizes) >= 1
    # Never more than one example away from the exact share, except where the floor of 1 binds.
    for size, speed in zip(sizes, speeds, strict=True):
        exact = global_batch * speed / sum(speeds)
        assert size <= max(1, np.ceil(exact)) + len(speeds)


@pytest.mark.parametrize(
    ("global_batch", "speeds", "message"),
    [
        (2, [1.0, 1.0, 1.0], "cannot give each of 3 ranks an example"),
        (8, [1.0, 0.0], "speeds must be finite and > 0"),
        (8, [1.0, float("nan")], "speeds must be finite and > 0"),
        (8, [], "at least one rank"),
    ],
)
def test_split_batch_rejects_what_it_cannot_split(
    global_batch: int, speeds: list[float], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        split_batch(global_batch, speeds)


def test_weighted_average_of_rank_means_is_the_mean_over_all_examples() -> None:
    rng = np.random.default_rng(0)
    sizes = (26, 26, 6, 6)
    per_example = [rng.normal(size=(size, 5)) for size in sizes]
    rank_means = [examples.mean(axis=0) for examples in per_example]
    averaged = np.mean(
        [gradient_weight(sizes, rank) * mean for rank, mean in enumerate(rank_means)], axis=0
    )
    np.testing.assert_allclose(averaged, np.concatenate(per_example).mean(axis=0))


def test_proportional_shards_are_disjoint_cover_and_follow_the_shares() -> None:
    shares = (26, 26, 6, 6)
    parts = [proportional_indices(4000, part, shares) for part in range(4)]
    assert sorted(np.concatenate(parts).tolist()) == list(range(4000))
    steps = [len(indices) // share for indices, share in zip(parts, shares, strict=True)]
    assert max(steps) - min(steps) <= 1
    with pytest.raises(ValueError, match="shares must be whole numbers >= 1"):
        proportional_indices(10, 0, (3, 0))


def test_pipelines_with_unequal_batches_run_the_same_steps() -> None:
    from globaldl.pipelines import make_pipeline

    sizes = (24, 8)
    pipelines = [
        make_pipeline(
            "digits", rank=rank, num_ranks=2, batch_size=sizes[rank], seed=0, rank_batch_sizes=sizes
        )
        for rank in range(2)
    ]
    assert pipelines[0].steps_per_epoch == pipelines[1].steps_per_epoch > 0
    for pipeline, size in zip(pipelines, sizes, strict=True):
        images, labels = next(iter(pipeline.train_batches(0)))
        assert images.shape[0] == labels.shape[0] == size
    with pytest.raises(ValueError, match="need the in-memory dataset"):
        make_pipeline(
            "digits",
            rank=0,
            num_ranks=2,
            batch_size=24,
            seed=0,
            rank_batch_sizes=sizes,
            data_dir="/tmp/unused",
        )
    with pytest.raises(ValueError, match="one batch size per rank"):
        make_pipeline("digits", rank=0, num_ranks=2, batch_size=8, seed=0, rank_batch_sizes=sizes)


def _tiny_model_and_batches(sizes: list[int]) -> tuple[Any, Any, list[Any], list[Any]]:
    import tensorflow as tf
    import tf_keras as keras

    model = keras.Sequential([keras.layers.Dense(3)])
    model(tf.zeros((1, 5)))
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    batches = [(tf.ones((size, 5)), tf.zeros((size,), tf.int32)) for size in sizes]
    return model, loss_fn, model.trainable_variables, batches


def test_measure_speed_counts_the_timed_examples_over_the_timed_seconds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A clock that advances one second a reading: the probe reads it when it starts, once to
    # see its time is up (after one pass, with no minimum time), and when it ends.
    readings = iter(range(100))
    monkeypatch.setattr(balance, "PROBE_SECONDS", 0.0)
    model, loss_fn, variables, batches = _tiny_model_and_batches([8, 4, 4, 2])
    # The 8-example batch warms up untimed; 4 + 4 + 2 examples in two seconds.
    speed = balance.measure_speed(
        model, loss_fn, variables, batches, clock=lambda: float(next(readings))
    )
    assert speed == 5.0


def test_measure_speed_refuses_a_probe_with_nothing_to_time() -> None:
    model, loss_fn, variables, batches = _tiny_model_and_batches([4])
    with pytest.raises(ValueError, match="at least two batches"):
        balance.measure_speed(model, loss_fn, variables, batches)
