"""Bad arguments fail at once with a ValueError that names the value and what is allowed."""

from __future__ import annotations

import pytest

from globaldl.pipelines import DATASET_NAMES, make_pipeline


def test_unknown_dataset_names_the_value_and_the_valid_names() -> None:
    with pytest.raises(ValueError) as failure:
        make_pipeline("imagenet", rank=0, num_ranks=1, batch_size=8, seed=0)
    assert "'imagenet'" in str(failure.value)
    assert all(name in str(failure.value) for name in DATASET_NAMES)


def test_batch_larger_than_the_rank_shard_gives_the_numbers() -> None:
    with pytest.raises(ValueError) as failure:
        make_pipeline("mnist", rank=0, num_ranks=2, batch_size=5000, seed=0)
    assert str(failure.value) == (
        "batch size 5000 is larger than the 2000 training examples of rank 0 of 2; "
        "at most 2000 is possible"
    )


def test_batch_check_uses_the_smallest_rank_so_every_rank_agrees() -> None:
    # 1437 digits over 2 ranks: rank 0 owns 719, rank 1 owns 718
    for rank in range(2):
        with pytest.raises(ValueError, match="719 is larger than the 718 .* of rank 1 of 2"):
            make_pipeline("digits", rank=rank, num_ranks=2, batch_size=719, seed=0)
    assert make_pipeline("digits", rank=0, num_ranks=2, batch_size=718, seed=0).steps_per_epoch == 1


@pytest.mark.parametrize("batch_size", [0, -3, 2.5])
def test_batch_size_below_one_or_not_integer_is_rejected(batch_size) -> None:
    with pytest.raises(ValueError, match=f"batch size must be an integer >= 1, got {batch_size}"):
        make_pipeline("digits", rank=0, num_ranks=1, batch_size=batch_size, seed=0)


@pytest.mark.parametrize(
    "rank,num_ranks,message",
    [
        (0, 0, r"num_ranks must be an integer >= 1, got 0"),
        (-1, 2, r"rank must be an integer in \[0, 2\), got -1"),
        (2, 2, r"rank must be an integer in \[0, 2\), got 2"),
    ],
)
def test_rank_outside_range_is_rejected(rank: int, num_ranks: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make_pipeline("digits", rank=rank, num_ranks=num_ranks, batch_size=8, seed=0)


def test_negative_seed_and_delay_are_rejected() -> None:
    with pytest.raises(ValueError, match="seed must be a non-negative integer, got -1"):
        make_pipeline("digits", rank=0, num_ranks=1, batch_size=8, seed=-1)
    with pytest.raises(ValueError, match="input_delay_ms must be a finite number >= 0, got -5"):
        make_pipeline("digits", rank=0, num_ranks=1, batch_size=8, seed=0, input_delay_ms=-5)


def test_skip_batches_and_epoch_outside_range_are_rejected() -> None:
    pipeline = make_pipeline("digits", rank=0, num_ranks=1, batch_size=100, seed=0)
    with pytest.raises(ValueError, match=r"skip_batches must be an integer in \[0, 14\].*got 15"):
        pipeline.train_batches(epoch=0, skip_batches=15)
    with pytest.raises(ValueError, match="epoch must be an integer >= 0, got -1"):
        pipeline.train_batches(epoch=-1)
