"""The dataset registry: names, specs, and the per-process cache of generated arrays."""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable

from globaldl.pipelines import cifar_synthetic, digits, mnist, moving_mnist
from globaldl.pipelines.spec import DatasetArrays, DatasetSpec

DATASET_NAMES: tuple[str, ...] = ("mnist", "digits", "cifar-synthetic", "moving-mnist")

_GENERATORS: dict[str, tuple[DatasetSpec, Callable[[int], DatasetArrays]]] = {
    module.SPEC.name: (module.SPEC, module.generate)
    for module in (mnist, digits, cifar_synthetic, moving_mnist)
}


def dataset_spec(name: str) -> DatasetSpec:
    """The spec of dataset ``name``, without generating or loading any data."""
    return _GENERATORS[require_dataset_name(name)][0]


def require_dataset_name(name: str) -> str:
    """Return ``name`` if it is a dataset name, else raise ValueError listing the valid names."""
    if name not in _GENERATORS:
        raise ValueError(f"unknown dataset {name!r}; choose one of {DATASET_NAMES}")
    return name


def require_seed(seed: int) -> int:
    """Return ``seed`` if it is a non-negative integer (what NumPy's seeding accepts)."""
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    return seed


@functools.lru_cache(maxsize=8)
def load_arrays(name: str, seed: int) -> DatasetArrays:
    """Generate (or load) dataset ``name`` for ``seed`` once per process; later calls are free.

    The same (name, seed) gives bit-identical arrays in every process and on every machine.
    """
    _, generate = _GENERATORS[require_dataset_name(name)]
    return generate(require_seed(seed))


@functools.lru_cache(maxsize=8)
def content_sha256(name: str, seed: int) -> str:
    """SHA-256 over every array of the dataset: tells a stale TFRecord copy from a fresh one."""
    arrays = load_arrays(name, seed)
    digest = hashlib.sha256()
    for array in (
        arrays.train_images,
        arrays.train_labels,
        arrays.validation_images,
        arrays.validation_labels,
    ):
        digest.update(array.tobytes())
    return digest.hexdigest()
