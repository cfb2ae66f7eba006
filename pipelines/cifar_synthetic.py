"""The ``cifar-synthetic`` dataset: 32x32 RGB images of 10 texture classes, drawn from a seed.

The generative model (every random draw comes from ``numpy.random.default_rng`` seeded by the
dataset seed, so a seed gives the same images everywhere):

* Class ``c`` is a texture: a Gabor patch (a sinusoidal grating under a Gaussian window) whose
  orientation is ``(c % 5) * 36`` degrees and whose spatial frequency is 3 cycles per image for
  ``c < 5`` and 6 cycles per image for ``c >= 5``. Each image jitters the orientation by up to
  +-10 degrees and the frequency by up to +-10 %, draws the grating's phase uniformly, the
  window's centre anywhere in the central 16x16 pixels and its width (sigma 5-9 pixels), and
  the contrast (amplitude 0.15-0.35).
* The grating modulates the three colour channels along a random colour direction of the
  image, so colour says nothing about the class, except for a weak class cue: each class has
  its own mean tint (a fixed random RGB offset of norm 0.05), far smaller than the
  per-image background variation.
* Class-independent clutter: a background with a random base colour and a linear colour
  gradient in a random direction, three Gaussian blobs of random colour, sign, size and place,
  and independent Gaussian pixel noise (sigma 0.12).
* Values are clipped to [0, 1] and stored as ``uint8`` like real CIFAR.

Why a CNN learns it and a linear model does not: with a uniformly random phase and position,
the class-conditional mean of every pixel is (almost) the same for all classes, so a linear
classifier on pixels sees little beyond the weak tint cue; oriented, frequency-tuned filters
followed by a non-linearity and pooling (what a CNN learns) detect the texture anywhere.
Labels are balanced: exactly 800 training and 200 validation images per class.
"""

from __future__ import annotations

import zlib

import numpy as np

from globaldl.pipelines.spec import DatasetArrays, DatasetSpec

SPEC = DatasetSpec(
    name="cifar-synthetic", input_shape=(32, 32, 3), num_classes=10, train_size=8000, val_size=2000
)
PIXEL_MAX = 255

_SIDE_PIXELS = 32
_ORIENTATION_STEP_DEGREES = 36.0
_ORIENTATION_JITTER_DEGREES = 10.0
_CYCLES_PER_IMAGE = (3.0, 6.0)
_FREQUENCY_JITTER = 0.10
_GRATING_AMPLITUDE = (0.15, 0.35)
_WINDOW_SIGMA_PIXELS = (5.0, 9.0)
_CLASS_TINT_NORM = 0.05
_BLOBS_PER_IMAGE = 3
_NOISE_SIGMA = 0.12
# Images are drawn in fixed-size chunks so peak memory stays small; the chunk size is part of
# the generative model (changing it changes the images for a seed).
_CHUNK_IMAGES = 1000


def generate(seed: int) -> DatasetArrays:
    """Draw all 10,000 images for ``seed`` (about a second on one core) and split them."""
    rng = np.random.default_rng([seed, zlib.crc32(SPEC.name.encode())])
    total = SPEC.train_size + SPEC.val_size
    tints = rng.normal(size=(SPEC.num_classes, 3))
    tints *= _CLASS_TINT_NORM / np.linalg.norm(tints, axis=1, keepdims=True)
    labels = np.concatenate(
        [
            rng.permutation(np.arange(size) % SPEC.num_classes)
            for size in (SPEC.train_size, SPEC.val_size)
        ]
    ).astype(np.int32)
    images = np.empty((total, *SPEC.input_shape), dtype=np.uint8)
    for start in range(0, total, _CHUNK_IMAGES):
        chunk = slice(start, min(start + _CHUNK_IMAGES, total))
        images[chunk] = _draw_images(labels[chunk], tints, rng)
    return DatasetArrays(
        spec=SPEC,
        train_images=images[: SPEC.train_size],
        train_labels=labels[: SPEC.train_size],
        validation_images=images[SPEC.train_size :],
        validation_labels=labels[SPEC.train_size :],
        pixel_max=PIXEL_MAX,
    )


def _draw_images(labels: np.ndarray, tints: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Render one chunk of images (uint8, N x 32 x 32 x 3) for the given labels.

    Every 2-D pattern here is separable (a product or a sum of products of a row profile and
    a column profile), so it is built from (N, 32) arrays by an outer product: ~30x fewer
    transcendental function calls than evaluating each pixel.
    """
    count = len(labels)

    # Texture: a Gabor patch whose orientation and frequency carry the class.
    orientation = np.deg2rad(
        (labels % 5) * _ORIENTATION_STEP_DEGREES
        + rng.uniform(-_ORIENTATION_JITTER_DEGREES, _ORIENTATION_JITTER_DEGREES, count)
    )
    cycles = np.asarray(_CYCLES_PER_IMAGE)[(labels >= 5).astype(int)]
    cycles = cycles * rng.uniform(1 - _FREQUENCY_JITTER, 1 + _FREQUENCY_JITTER, count)
    radians_per_pixel = 2 * np.pi * cycles / _SIDE_PIXELS
    phase = rng.uniform(0, 2 * np.pi, count)
    # cos(kc * col + kr * row + phase) = cos(kc col) cos(kr row + phase)
    #                                  - sin(kc col) sin(kr row + phase)
    col_angle = _profile(radians_per_pixel * np.cos(orientation), 0.0)
    row_angle = _profile(radians_per_pixel * np.sin(orientation), phase)
    grating = _outer(np.cos(row_angle), np.cos(col_angle)) - _outer(
        np.sin(row_angle), np.sin(col_angle)
    )
    centre_row, centre_col = rng.uniform(-8, 8, (2, count))
    sigma = rng.uniform(*_WINDOW_SIGMA_PIXELS, count)
    window = _gaussian_bump(centre_row, centre_col, sigma)
    amplitude = rng.uniform(*_GRATING_AMPLITUDE, count)
    texture = grating * window * amplitude.astype(np.float32)[:, None, None]
    colour_direction = rng.normal(size=(count, 3))
    colour_direction /= np.linalg.norm(colour_direction, axis=1, keepdims=True)
    image = _coloured(texture, colour_direction)

    # Background: a base colour plus a linear colour gradient in a random direction.
    base = rng.uniform(0.25, 0.75, (count, 3))
    gradient_angle = rng.uniform(0, 2 * np.pi, count)
    gradient = (
        _profile(np.cos(gradient_angle) / _SIDE_PIXELS, 0.0)[:, None, :]
        + _profile(np.sin(gradient_angle) / _SIDE_PIXELS, 0.0)[:, :, None]
    )
    gradient_colour = rng.uniform(-0.3, 0.3, (count, 3))
    image += _coloured(gradient, gradient_colour)
    image += (base + tints[labels]).astype(np.float32)[:, None, None, :]

    # Clutter: Gaussian blobs of random colour, sign, size and place.
    for _ in range(_BLOBS_PER_IMAGE):
        blob_row, blob_col = rng.uniform(-14, 14, (2, count))
        blob_sigma = rng.uniform(1.5, 4.0, count)
        blob_colour = rng.uniform(-0.4, 0.4, (count, 3))
        image += _coloured(_gaussian_bump(blob_row, blob_col, blob_sigma), blob_colour)

    image += _NOISE_SIGMA * rng.standard_normal(image.shape, dtype=np.float32)
    return np.round(np.clip(image, 0, 1) * PIXEL_MAX).astype(np.uint8)


def _profile(slope: np.ndarray, offset: np.ndarray | float) -> np.ndarray:
    """``slope * coordinate + offset`` per image, over centred pixel coordinates: (N, 32)."""
    coords = np.arange(_SIDE_PIXELS, dtype=np.float32) - (_SIDE_PIXELS - 1) / 2
    return (np.asarray(slope)[:, None] * coords[None, :] + np.asarray(offset)[..., None]).astype(
        np.float32
    )


def _outer(row_profile: np.ndarray, col_profile: np.ndarray) -> np.ndarray:
    """Per-image outer product of a row and a column profile: (N, 32, 32)."""
    return row_profile[:, :, None] * col_profile[:, None, :]


def _gaussian_bump(centre_row: np.ndarray, centre_col: np.ndarray, sigma: np.ndarray) -> np.ndarray:
    """Isotropic Gaussians of peak 1 at the given centres (pixels from the image centre)."""

    def along_axis(centre: np.ndarray) -> np.ndarray:
        return np.exp(-0.5 * (_profile(1 / sigma, -centre / sigma)) ** 2)

    return _outer(along_axis(centre_row), along_axis(centre_col))


def _coloured(pattern: np.ndarray, colour: np.ndarray) -> np.ndarray:
    """A (N, 32, 32) pattern times a per-image RGB colour: (N, 32, 32, 3) float32."""
    return pattern[..., None] * colour.astype(np.float32)[:, None, None, :]
