"""The ``moving-mnist`` dataset: 8-frame clips of one MNIST digit bouncing in a 32x32 frame.

The generative model (all draws from ``numpy.random.default_rng`` seeded by the dataset seed):

* Each clip shows one digit from the ``mnist`` dataset of the same seed (training clips use
  its training digits, validation clips its validation digits, so no digit appears in both),
  cut out by the 20x20 window centred on its bounding box (MNIST scaled every digit to fit
  a 20x20 box), on a black 32x32 frame, for 8 frames.
* The digit starts anywhere it fits and moves with constant speed, bouncing off the frame
  edges (an elastic reflection: the position is folded back into the 12 free pixels on
  each axis). Its motion kind is one of three, in equal numbers:
  0 horizontal (vertical speed 0), 1 vertical (horizontal speed 0), 2 diagonal (both moving).
  Every moving axis has a speed of 1.5-3.0 pixels per frame, in a random direction.
* Label (6 classes) = ``2 * motion_kind + (digit >= 5)``: the clip says how it moves and
  whether the digit is one of 0-4 or 5-9.

Why the task needs the clip: a single frame shows where the digit is, never how it moves,
because start positions are uniform; the motion kind is only visible by comparing frames,
and bounces flip the direction of motion but never turn a horizontal motion vertical or
diagonal, so the motion kind stays well defined. The digit half needs the shape. A 3-D
convolution (or any model that compares frames) can learn both; a classifier that sees
one frame can at best get the digit half right and guess the motion (1/3 accuracy).
Measured: the ``video`` model reaches 0.93 validation accuracy after 6 epochs (motion
0.99, digit half 0.94; chance 1/6).
"""

from __future__ import annotations

import zlib

import numpy as np

from globaldl.pipelines import mnist
from globaldl.pipelines.spec import DatasetArrays, DatasetSpec

FRAMES = 8
FRAME_PIXELS = 32
MOTION_KINDS = ("horizontal", "vertical", "diagonal")
SPEC = DatasetSpec(
    name="moving-mnist",
    input_shape=(FRAMES, FRAME_PIXELS, FRAME_PIXELS, 1),
    num_classes=2 * len(MOTION_KINDS),
    train_size=4000,
    val_size=1000,
)
PIXEL_MAX = 255

_DIGIT_PIXELS = 20
_FREE_PIXELS = FRAME_PIXELS - _DIGIT_PIXELS
_SPEED_PIXELS_PER_FRAME = (1.5, 3.0)


def generate(seed: int) -> DatasetArrays:
    """Render 4,000 training and 1,000 validation clips for ``seed`` (well under a second)."""
    rng = np.random.default_rng([seed, zlib.crc32(SPEC.name.encode())])
    digits = mnist.generate(seed)
    train_clips, train_labels = _render_clips(
        digits.train_images, digits.train_labels, SPEC.train_size, rng
    )
    validation_clips, validation_labels = _render_clips(
        digits.validation_images, digits.validation_labels, SPEC.val_size, rng
    )
    return DatasetArrays(
        spec=SPEC,
        train_images=train_clips,
        train_labels=train_labels,
        validation_images=validation_clips,
        validation_labels=validation_labels,
        pixel_max=PIXEL_MAX,
    )


def _render_clips(
    digit_images: np.ndarray, digit_labels: np.ndarray, count: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Draw ``count`` clips (uint8, count x 8 x 32 x 32 x 1) and their labels."""
    source = np.arange(count) % len(digit_images)
    digits = _crop_digits(digit_images[source, :, :, 0])
    motion_kind = rng.permutation(np.arange(count) % len(MOTION_KINDS))
    moves_horizontally = motion_kind != MOTION_KINDS.index("vertical")
    moves_vertically = motion_kind != MOTION_KINDS.index("horizontal")
    speed = rng.uniform(*_SPEED_PIXELS_PER_FRAME, (count, 2)) * rng.choice([-1, 1], (count, 2))
    velocity = speed * np.stack([moves_vertically, moves_horizontally], axis=1)
    start = rng.uniform(0, _FREE_PIXELS, (count, 2))
    frame_index = np.arange(FRAMES)[None, :, None]
    unfolded = start[:, None, :] + velocity[:, None, :] * frame_index
    # Elastic bounce: fold the free-flight position into [0, free] (a triangle wave).
    folded = np.abs((unfolded + _FREE_PIXELS) % (2 * _FREE_PIXELS) - _FREE_PIXELS)
    corner = np.clip(np.round(folded), 0, _FREE_PIXELS).astype(np.int64)  # (count, frames, 2)

    clips = np.zeros((count, FRAMES, FRAME_PIXELS, FRAME_PIXELS), dtype=np.uint8)
    offsets = np.arange(_DIGIT_PIXELS)
    clip_index = np.arange(count)[:, None, None, None]
    frame = np.arange(FRAMES)[None, :, None, None]
    rows = corner[:, :, 0, None, None] + offsets[None, None, :, None]
    cols = corner[:, :, 1, None, None] + offsets[None, None, None, :]
    clips[clip_index, frame, rows, cols] = digits[:, None, :, :]

    labels = 2 * motion_kind + (digit_labels[source] >= 5)
    return clips[..., None], labels.astype(np.int32)


def _crop_digits(images: np.ndarray) -> np.ndarray:
    """Cut the 20x20 window centred on each digit's bounding box out of 28x28 images."""
    count, side, _ = images.shape
    starts = []
    for axis in (2, 1):  # rows (ink in any column), then columns (ink in any row)
        inked = images.any(axis=axis)
        first = inked.argmax(axis=1)
        last = side - 1 - inked[:, ::-1].argmax(axis=1)
        centre = (first + last + 1) / 2
        starts.append(np.clip(np.round(centre - _DIGIT_PIXELS / 2), 0, side - _DIGIT_PIXELS))
    window = np.arange(_DIGIT_PIXELS)
    rows = starts[0].astype(np.int64)[:, None, None] + window[None, :, None]
    cols = starts[1].astype(np.int64)[:, None, None] + window[None, None, :]
    return images[np.arange(count)[:, None, None], rows, cols]
