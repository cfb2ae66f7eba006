"""What a dataset is: its shape and sizes (DatasetSpec) and its generated arrays (DatasetArrays)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class DatasetSpec:
    """The fixed description of one dataset, known without generating it.

    Attributes:
        name: registry name, one of ``DATASET_NAMES``.
        input_shape: shape of one example; images are (height, width, channels),
            clips are (frames, height, width, channels).
        num_classes: labels are integers in ``[0, num_classes)``.
        train_size: examples in the training split.
        val_size: examples in the validation split.

    """

    name: str
    input_shape: tuple[int, ...]
    num_classes: int
    train_size: int
    val_size: int

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (tuples become lists), as stored in a TFRecord manifest."""
        as_dict = asdict(self)
        as_dict["input_shape"] = list(self.input_shape)
        return as_dict


@dataclass(frozen=True, eq=False)
class DatasetArrays:
    """One dataset held in memory, before scaling: pixels are ``uint8`` in ``[0, pixel_max]``.

    Pixels stay ``uint8`` until a batch is formed (a quarter of the memory and of the bytes on
    disk); the pipeline divides by ``pixel_max`` to give ``float32`` values in ``[0, 1]``.
    The arrays are read-only, because one cached copy is shared by every pipeline.
    """

    spec: DatasetSpec
    train_images: np.ndarray
    train_labels: np.ndarray
    validation_images: np.ndarray
    validation_labels: np.ndarray
    pixel_max: int

    def __post_init__(self) -> None:
        for split, images, labels, size in (
            ("train", self.train_images, self.train_labels, self.spec.train_size),
            ("validation", self.validation_images, self.validation_labels, self.spec.val_size),
        ):
            if images.dtype != np.uint8 or labels.dtype != np.int32:
                raise ValueError(
                    f"{self.spec.name} {split}: images must be uint8 and labels int32, "
                    f"got {images.dtype} and {labels.dtype}"
                )
            if images.shape != (size, *self.spec.input_shape) or labels.shape != (size,):
                raise ValueError(
                    f"{self.spec.name} {split}: expected {size} examples of shape "
                    f"{self.spec.input_shape}, got images {images.shape} and labels {labels.shape}"
                )
            images.setflags(write=False)
            labels.setflags(write=False)

    def images(self, split: str) -> np.ndarray:
        """The ``uint8`` images of ``split`` ("train" or "validation")."""
        return self.train_images if split == "train" else self.validation_images

    def labels(self, split: str) -> np.ndarray:
        """The ``int32`` labels of ``split`` ("train" or "validation")."""
        return self.train_labels if split == "train" else self.validation_labels
