"""LeNet-5 (LeCun et al. 1998) for small images, with padding adapted to the input size."""

from __future__ import annotations

import tf_keras as keras

from globaldl.models.initializers import LayerSeeds
from globaldl.models.validation import require_image_shape

_KERNEL_PIXELS = 5
# LeNet-5 was designed for 32x32 inputs: there the first convolution is 'valid' (32 -> 28).
_CLASSIC_INPUT_PIXELS = 32


def build_lenet(input_shape: tuple[int, ...], num_classes: int, seed: int) -> keras.Model:
    """Conv 6@5x5 -> max-pool -> conv 16@5x5 -> max-pool -> dense 120 -> dense 84 -> logits.

    Padding follows the input size so that any image of at least 1x1 works:

    * first convolution: 'valid' for inputs of 32x32 or more (the original LeNet-5), 'same'
      below (28x28 MNIST keeps 28x28, as the common MNIST variant pads by 2);
    * second convolution: 'valid' if the pooled map is at least 10 pixels (28x28 MNIST: 14 -> 10),
      'same' below (8x8 digits: 4 -> 4);
    * pooling uses 'same' padding, so a 1-pixel map stays 1 pixel instead of vanishing.
    """
    height, width, _ = require_image_shape("lenet", input_shape)
    seeds = LayerSeeds(seed)
    smallest_side = min(height, width)
    first_padding = "valid" if smallest_side >= _CLASSIC_INPUT_PIXELS else "same"
    after_first_pool = _pooled(
        smallest_side - (_KERNEL_PIXELS - 1 if first_padding == "valid" else 0)
    )
    second_padding = "valid" if after_first_pool >= 2 * _KERNEL_PIXELS else "same"

    inputs = keras.Input(shape=input_shape, name="image")
    x = keras.layers.Conv2D(
        6,
        _KERNEL_PIXELS,
        padding=first_padding,
        activation="relu",
        kernel_initializer=seeds.glorot_uniform(),
        name="conv1",
    )(inputs)
    x = keras.layers.MaxPooling2D(2, padding="same", name="pool1")(x)
    x = keras.layers.Conv2D(
        16,
        _KERNEL_PIXELS,
        padding=second_padding,
        activation="relu",
        kernel_initializer=seeds.glorot_uniform(),
        name="conv2",
    )(x)
    x = keras.layers.MaxPooling2D(2, padding="same", name="pool2")(x)
    x = keras.layers.Flatten(name="flatten")(x)
    x = keras.layers.Dense(
        120, activation="relu", kernel_initializer=seeds.glorot_uniform(), name="dense1"
    )(x)
    x = keras.layers.Dense(
        84, activation="relu", kernel_initializer=seeds.glorot_uniform(), name="dense2"
    )(x)
    logits = keras.layers.Dense(
        num_classes, kernel_initializer=seeds.glorot_uniform(), name="logits"
    )(x)
    return keras.Model(inputs, logits, name="lenet")


def _pooled(side_pixels: int) -> int:
    """Side length after a 2x2 max-pool with 'same' padding."""
    return (side_pixels + 1) // 2
