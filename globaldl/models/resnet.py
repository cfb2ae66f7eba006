"""CIFAR-style ResNet (He et al., "Deep Residual Learning", CVPR 2016, section 4.2): 6n+2 layers."""

from __future__ import annotations

from collections.abc import Callable

import tf_keras as keras

from globaldl.models.initializers import LayerSeeds
from globaldl.models.validation import require_image_shape

RESNET_DEPTHS: tuple[int, ...] = (8, 14, 20, 32)
_STAGE_FILTERS = (16, 32, 64)
# Keras' BatchNormalization defaults (momentum 0.99) adapt too slowly for the few hundred
# steps of an edge run; 0.9 is the value of the original Torch/Caffe CIFAR ResNets.
_BATCH_NORM_MOMENTUM = 0.9

# Builds one batch normalisation layer from the keyword arguments `momentum` and `name`.
BatchNormFactory = Callable[..., keras.layers.Layer]


def build_resnet(
    input_shape: tuple[int, ...],
    num_classes: int,
    depth: int,
    seed: int,
    batch_norm: BatchNormFactory = keras.layers.BatchNormalization,
) -> keras.Model:
    """ResNet-``depth`` for small images: ``depth = 6n + 2`` with n basic blocks per stage.

    A 3x3 convolution with 16 filters, then three stages of ``n`` basic blocks (two 3x3
    convolutions, each followed by batch normalisation) with 16, 32 and 64 filters; the first
    block of stages 2 and 3 halves the map with stride 2 and projects its shortcut with a 1x1
    convolution (the paper's option B). Global average pooling and a dense layer give logits.
    ``batch_norm`` builds the normalisation layers (Horovod's synchronised one, for instance).
    """
    if isinstance(depth, bool) or not isinstance(depth, int) or depth not in RESNET_DEPTHS:
        raise ValueError(f"resnet depth {depth!r} is not supported; choose one of {RESNET_DEPTHS}")
    require_image_shape("resnet", input_shape)
    blocks_per_stage = (depth - 2) // 6
    seeds = LayerSeeds(seed)

    inputs = keras.Input(shape=input_shape, name="image")
    x = _conv_bn(inputs, _STAGE_FILTERS[0], 1, seeds, batch_norm, name="stem")
    x = keras.layers.ReLU(name="stem_relu")(x)
    for stage, filters in enumerate(_STAGE_FILTERS, start=1):
        for block in range(1, blocks_per_stage + 1):
            strides = 2 if stage > 1 and block == 1 else 1
            x = _basic_block(
                x, filters, strides, seeds, batch_norm, name=f"stage{stage}_block{block}"
            )
    x = keras.layers.GlobalAveragePooling2D(name="global_pool")(x)
    logits = keras.layers.Dense(num_classes, kernel_initializer=seeds.he_normal(), name="logits")(x)
    return keras.Model(inputs, logits, name=f"resnet{depth}")


def _conv_bn(
    x,
    filters: int,
    strides: int,
    seeds: LayerSeeds,
    batch_norm: BatchNormFactory,
    name: str,
    kernel: int = 3,
):
    """Convolution (no bias: batch normalisation supplies the shift) followed by batch norm."""
    x = keras.layers.Conv2D(
        filters,
        kernel,
        strides=strides,
        padding="same",
        use_bias=False,
        kernel_initializer=seeds.he_normal(),
        name=f"{name}_conv",
    )(x)
    return batch_norm(momentum=_BATCH_NORM_MOMENTUM, name=f"{name}_bn")(x)


def _basic_block(
    x, filters: int, strides: int, seeds: LayerSeeds, batch_norm: BatchNormFactory, name: str
):
    """Two 3x3 conv-BN layers with a shortcut; ReLU after the sum (the paper's original block)."""
    shortcut = x
    if strides != 1 or x.shape[-1] != filters:
        shortcut = _conv_bn(
            x, filters, strides, seeds, batch_norm, name=f"{name}_projection", kernel=1
        )
    x = _conv_bn(x, filters, strides, seeds, batch_norm, name=f"{name}_a")
    x = keras.layers.ReLU(name=f"{name}_a_relu")(x)
    x = _conv_bn(x, filters, 1, seeds, batch_norm, name=f"{name}_b")
    x = keras.layers.Add(name=f"{name}_add")([shortcut, x])
    return keras.layers.ReLU(name=f"{name}_relu")(x)
