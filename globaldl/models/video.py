"""A small 3-D convolutional clip classifier, sized to train on two CPU cores."""

from __future__ import annotations

import tf_keras as keras

from globaldl.models.initializers import LayerSeeds
from globaldl.models.validation import require_clip_shape

# (filters, kernel (frames, rows, cols), pooling after it or None), in order.
_LAYERS: tuple[tuple[int, tuple[int, int, int], tuple[int, int, int] | None], ...] = (
    (16, (1, 3, 3), (1, 2, 2)),
    (16, (3, 3, 3), (1, 2, 2)),
    (32, (3, 3, 3), (2, 2, 2)),
    (64, (3, 3, 3), None),
)


def build_video(input_shape: tuple[int, ...], num_classes: int, seed: int) -> keras.Model:
    """Four ReLU convolutions (16, 16, 32, 64 filters), global average pool, dense 64, logits.

    The first convolution looks at one frame at a time (1x3x3): edges and strokes of the
    object. The next three are 3x3x3 and see three consecutive frames, so they respond to
    how those strokes move. The first two poolings halve only space, the third halves time
    as well (if the clip has at least two frames left). 'same' padding and 'same' pooling
    keep every map at least 1x1x1, so clips of any size work. About 81,000 weights; an
    epoch of 4,000 8x32x32 clips (batch 32) took 18-21 s on two shared CPU cores.
    """
    frames, _, _, _ = require_clip_shape("video", input_shape)
    seeds = LayerSeeds(seed)
    inputs = keras.Input(shape=input_shape, name="clip")
    x = inputs
    frames_left = frames
    for number, (filters, kernel, pooling) in enumerate(_LAYERS, start=1):
        x = keras.layers.Conv3D(
            filters,
            kernel,
            padding="same",
            activation="relu",
            kernel_initializer=seeds.he_normal(),
            name=f"conv{number}",
        )(x)
        if pooling is not None:
            time_pool = pooling[0] if frames_left >= pooling[0] else 1
            frames_left = (frames_left + time_pool - 1) // time_pool
            x = keras.layers.MaxPooling3D(
                (time_pool, *pooling[1:]), padding="same", name=f"pool{number}"
            )(x)
    x = keras.layers.GlobalAveragePooling3D(name="global_pool")(x)
    x = keras.layers.Dense(
        64, activation="relu", kernel_initializer=seeds.he_normal(), name="dense"
    )(x)
    logits = keras.layers.Dense(
        num_classes, kernel_initializer=seeds.glorot_uniform(), name="logits"
    )(x)
    return keras.Model(inputs, logits, name="video3d")
