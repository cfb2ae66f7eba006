"""A multilayer perceptron: the model whose depth and width sweep the layers x batch tables."""

from __future__ import annotations

import tf_keras as keras

from globaldl.models.initializers import LayerSeeds


def build_mlp(
    input_shape: tuple[int, ...], num_classes: int, hidden_layers: int, width: int, seed: int
) -> keras.Model:
    """Flatten, ``hidden_layers`` ReLU dense layers of ``width`` units, then a logits layer."""
    if not isinstance(hidden_layers, int) or hidden_layers < 1:
        raise ValueError(f"mlp_layers must be an integer >= 1, got {hidden_layers!r}")
    if not isinstance(width, int) or width < 1:
        raise ValueError(f"mlp_width must be an integer >= 1, got {width!r}")
    seeds = LayerSeeds(seed)
    inputs = keras.Input(shape=input_shape, name="input")
    x = keras.layers.Flatten(name="flatten")(inputs)
    for layer in range(1, hidden_layers + 1):
        x = keras.layers.Dense(
            width,
            activation="relu",
            kernel_initializer=seeds.glorot_uniform(),
            name=f"hidden{layer}",
        )(x)
    logits = keras.layers.Dense(
        num_classes, kernel_initializer=seeds.glorot_uniform(), name="logits"
    )(x)
    return keras.Model(inputs, logits, name=f"mlp{hidden_layers}x{width}")
