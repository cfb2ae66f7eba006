"""The ``digits`` dataset: scikit-learn's bundled 8x8 handwritten digits (1,797 images)."""

from __future__ import annotations

import zlib

import numpy as np

from globaldl.pipelines.spec import DatasetArrays, DatasetSpec
from globaldl.pipelines.splits import stratified_split

SPEC = DatasetSpec(
    name="digits", input_shape=(8, 8, 1), num_classes=10, train_size=1437, val_size=360
)
# load_digits stores 4x4-block counts: integers 0..16.
PIXEL_MAX = 16


def generate(seed: int) -> DatasetArrays:
    """Load the bundled images and split them 1,437 / 360, stratified, seeded by ``seed``."""
    from sklearn.datasets import load_digits  # imported here: only this dataset needs sklearn

    bunch = load_digits()
    images = bunch.images.reshape(-1, *SPEC.input_shape).astype(np.uint8)
    labels = bunch.target.astype(np.int32)
    rng = np.random.default_rng([seed, zlib.crc32(SPEC.name.encode())])
    train, validation = stratified_split(labels, SPEC.val_size, rng)
    return DatasetArrays(
        spec=SPEC,
        train_images=images[train],
        train_labels=labels[train],
        validation_images=images[validation],
        validation_labels=labels[validation],
        pixel_max=PIXEL_MAX,
    )
