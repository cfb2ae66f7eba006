"""Model registry: ``build_model(name, ...)`` returns a tf_keras model that outputs logits."""

from __future__ import annotations

import operator

import tf_keras as keras

from globaldl.models.lenet import build_lenet
from globaldl.models.mlp import build_mlp
from globaldl.models.resnet import RESNET_DEPTHS, BatchNormFactory, build_resnet
from globaldl.models.video import build_video

MODEL_NAMES: tuple[str, ...] = ("lenet", "resnet", "mlp", "video")

__all__ = ["MODEL_NAMES", "RESNET_DEPTHS", "BatchNormFactory", "build_model"]


def build_model(
    name: str,
    *,
    input_shape: tuple[int, ...],
    num_classes: int,
    resnet_depth: int = 20,
    mlp_layers: int = 3,
    mlp_width: int = 128,
    seed: int = 0,
    batch_norm: BatchNormFactory | None = None,
) -> keras.Model:
    """Build model ``name`` (one of ``MODEL_NAMES``) for inputs of ``input_shape``.

    The model outputs logits of shape (batch, num_classes), without softmax: train it with a
    ``from_logits=True`` loss. Weights are initialised from ``seed`` only (no global random
    state is read or changed), so two builds with the same arguments have identical weights.
    ``resnet_depth`` is used by "resnet" only, ``mlp_layers`` and ``mlp_width`` by "mlp" only.
    ``batch_norm`` builds the normalisation layers of models that have them (only "resnet");
    None means Keras' BatchNormalization.
    """
    if name not in MODEL_NAMES:
        raise ValueError(f"unknown model {name!r}; choose one of {MODEL_NAMES}")
    input_shape = tuple(_integer("input_shape entry", size, minimum=1) for size in input_shape)
    if not input_shape:
        raise ValueError("input_shape must have at least one dimension, got ()")
    num_classes = _integer("num_classes", num_classes, minimum=2)
    seed = _integer("seed", seed, minimum=0)
    if name == "lenet":
        return build_lenet(input_shape, num_classes, seed)
    if name == "resnet":
        return build_resnet(
            input_shape,
            num_classes,
            resnet_depth,
            seed,
            batch_norm=batch_norm or keras.layers.BatchNormalization,
        )
    if name == "mlp":
        return build_mlp(input_shape, num_classes, mlp_layers, mlp_width, seed)
    return build_video(input_shape, num_classes, seed)


def _integer(argument: str, value: int, minimum: int) -> int:
    """``value`` as a plain int (NumPy integers accepted) if it is >= ``minimum``."""
    try:
        integer = operator.index(value)
    except TypeError:
        integer = None
    if integer is None or isinstance(value, bool) or integer < minimum:
        raise ValueError(f"{argument} must be an integer >= {minimum}, got {value!r}")
    return integer
