"""Every model builds for its datasets' shapes, outputs logits, and starts from its seed alone."""

from __future__ import annotations

import numpy as np
import pytest
import tf_keras as keras

from globaldl.models import MODEL_NAMES, RESNET_DEPTHS, build_model
from globaldl.pipelines import dataset_spec

IMAGE_DATASETS = ("mnist", "digits", "cifar-synthetic")
MODEL_DATASETS = [
    *(("lenet", name) for name in IMAGE_DATASETS),
    *(("resnet", name) for name in IMAGE_DATASETS),
    *(("mlp", name) for name in (*IMAGE_DATASETS, "moving-mnist")),
    ("video", "moving-mnist"),
]


def _weights(model: keras.Model) -> list[np.ndarray]:
    return [weight.numpy() for weight in model.weights]


@pytest.mark.parametrize("model_name,dataset", MODEL_DATASETS)
def test_model_builds_for_dataset_and_outputs_batch_by_classes_logits(
    model_name: str, dataset: str
) -> None:
    spec = dataset_spec(dataset)
    model = build_model(
        model_name, input_shape=spec.input_shape, num_classes=spec.num_classes, resnet_depth=8
    )
    batch = np.random.default_rng(0).uniform(size=(3, *spec.input_shape)).astype(np.float32)
    outputs = model(batch, training=False).numpy()
    assert outputs.shape == (3, spec.num_classes)
    assert outputs.dtype == np.float32
    # logits, not probabilities: some are negative and rows do not sum to one
    assert outputs.min() < 0
    assert not np.allclose(outputs.sum(axis=1), 1.0)


@pytest.mark.parametrize("model_name", MODEL_NAMES)
def test_same_seed_gives_identical_weights_and_another_seed_other_weights(model_name: str) -> None:
    spec = dataset_spec("moving-mnist" if model_name == "video" else "digits")

    def build(seed: int) -> keras.Model:
        return build_model(
            model_name,
            input_shape=spec.input_shape,
            num_classes=spec.num_classes,
            resnet_depth=8,
            seed=seed,
        )

    first, again, other = build(11), build(11), build(12)
    assert all(np.array_equal(a, b) for a, b in zip(_weights(first), _weights(again), strict=True))
    kernels = [w for w in _weights(first) if w.ndim >= 2]
    other_kernels = [w for w in _weights(other) if w.ndim >= 2]
    assert not any(np.array_equal(a, b) for a, b in zip(kernels, other_kernels, strict=True))


def test_layers_of_equal_shape_start_from_different_weights() -> None:
    model = build_model(
        "mlp", input_shape=(8, 8, 1), num_classes=10, mlp_layers=3, mlp_width=64, seed=0
    )
    second, third = model.get_layer("hidden2").kernel, model.get_layer("hidden3").kernel
    assert second.shape == third.shape
    assert not np.array_equal(second.numpy(), third.numpy())


def test_building_a_model_leaves_global_random_state_alone() -> None:
    keras.utils.set_random_seed(123)
    expected = np.random.random()
    keras.utils.set_random_seed(123)
    build_model("lenet", input_shape=(28, 28, 1), num_classes=10, seed=5)
    assert np.random.random() == expected


@pytest.mark.parametrize("depth", RESNET_DEPTHS)
def test_resnet_depth_counts_its_weighted_layers(depth: int) -> None:
    model = build_model("resnet", input_shape=(32, 32, 3), num_classes=10, resnet_depth=depth)
    main_path = [
        layer
        for layer in model.layers
        if isinstance(layer, keras.layers.Conv2D | keras.layers.Dense)
        and "projection" not in layer.name
    ]
    assert len(main_path) == depth  # 6n + 2: stem, 6n block convolutions, the dense layer
    assert model.get_layer("global_pool").output_shape == (None, 64)
    assert any(isinstance(layer, keras.layers.BatchNormalization) for layer in model.layers)


@pytest.mark.parametrize("depth", [0, 9, 20.0, 56])
def test_resnet_rejects_other_depths_naming_the_allowed_ones(depth) -> None:
    with pytest.raises(ValueError, match=rf"resnet depth {depth!r} .* \(8, 14, 20, 32\)"):
        build_model("resnet", input_shape=(32, 32, 3), num_classes=10, resnet_depth=depth)


@pytest.mark.parametrize(
    "input_shape,flattened_units",
    [
        ((28, 28, 1), 16 * 5 * 5),
        ((32, 32, 3), 16 * 5 * 5),
        ((8, 8, 1), 16 * 2 * 2),
        ((1, 1, 1), 16),
    ],
)
def test_lenet_adapts_padding_so_small_inputs_stay_at_least_one_pixel(
    input_shape: tuple[int, ...], flattened_units: int
) -> None:
    model = build_model("lenet", input_shape=input_shape, num_classes=10)
    assert model.get_layer("flatten").output_shape == (None, flattened_units)
    assert [model.get_layer(name).filters for name in ("conv1", "conv2")] == [6, 16]
    assert [model.get_layer(name).units for name in ("dense1", "dense2")] == [120, 84]


def test_mlp_has_the_requested_hidden_layers_and_width() -> None:
    model = build_model("mlp", input_shape=(8, 8, 1), num_classes=10, mlp_layers=5, mlp_width=17)
    hidden = [layer for layer in model.layers if layer.name.startswith("hidden")]
    assert [layer.units for layer in hidden] == [17] * 5
    assert all(layer.activation is keras.activations.relu for layer in hidden)


@pytest.mark.parametrize("argument", [{"mlp_layers": 0}, {"mlp_width": 0}])
def test_mlp_rejects_zero_layers_or_width(argument: dict[str, int]) -> None:
    ((key, value),) = argument.items()
    with pytest.raises(ValueError, match=f"{key} must be an integer >= 1, got {value}"):
        build_model("mlp", input_shape=(8, 8, 1), num_classes=10, **argument)


def test_unknown_model_names_the_value_and_the_valid_names() -> None:
    with pytest.raises(ValueError) as failure:
        build_model("vgg", input_shape=(32, 32, 3), num_classes=10)
    assert "'vgg'" in str(failure.value)
    assert all(name in str(failure.value) for name in MODEL_NAMES)


@pytest.mark.parametrize(
    "model_name,input_shape",
    [("lenet", (8, 32, 32, 1)), ("resnet", (8, 32, 32, 1)), ("video", (32, 32, 3))],
)
def test_models_reject_inputs_of_the_wrong_rank(model_name: str, input_shape) -> None:
    with pytest.raises(ValueError, match=f"{model_name!r} takes"):
        build_model(model_name, input_shape=input_shape, num_classes=10)


@pytest.mark.parametrize("bad", [{"num_classes": 1}, {"seed": -1}, {"input_shape": (0, 8, 1)}])
def test_build_model_rejects_bad_common_arguments(bad: dict) -> None:
    arguments = {"input_shape": (8, 8, 1), "num_classes": 10, "seed": 0} | bad
    with pytest.raises(ValueError, match=next(iter(bad))):
        build_model("mlp", **arguments)


@pytest.mark.parametrize("model_name", MODEL_NAMES)
def test_model_config_round_trip_rebuilds_the_same_model(model_name: str) -> None:
    spec = dataset_spec("moving-mnist" if model_name == "video" else "cifar-synthetic")
    model = build_model(
        model_name,
        input_shape=spec.input_shape,
        num_classes=spec.num_classes,
        resnet_depth=8,
        seed=3,
    )
    rebuilt = keras.Model.from_config(model.get_config())
    assert rebuilt.name == model.name
    assert [layer.name for layer in rebuilt.layers] == [layer.name for layer in model.layers]
    # seeded initialisers are part of the config, so even the starting weights match
    assert all(
        np.array_equal(a, b) for a, b in zip(_weights(model), _weights(rebuilt), strict=True)
    )


def test_resnet_builds_every_normalisation_layer_with_the_given_factory() -> None:
    built: list[str] = []

    def counting_batch_norm(**options: object) -> keras.layers.Layer:
        built.append(str(options["name"]))
        return keras.layers.BatchNormalization(**options)  # type: ignore[arg-type]

    spec = dataset_spec("cifar-synthetic")
    model = build_model(
        "resnet",
        input_shape=spec.input_shape,
        num_classes=spec.num_classes,
        resnet_depth=8,
        batch_norm=counting_batch_norm,
    )
    normalisations = [
        layer.name for layer in model.layers if isinstance(layer, keras.layers.BatchNormalization)
    ]
    # ResNet-8: the stem, 2 per block in 3 blocks, 2 projection shortcuts.
    assert len(built) == 9
    assert sorted(built) == sorted(normalisations)
    # Their moving statistics are the model's only non-trainable variables.
    assert len(model.non_trainable_variables) == 2 * 9


@pytest.mark.parametrize("model_name", MODEL_NAMES)
def test_every_variable_the_gradient_does_not_update_is_floating_and_can_be_averaged(
    model_name: str,
) -> None:
    """What the trainer averages across ranks at epoch ends: the non-trainable variables.

    The averaged gradient keeps the trainable ones identical on every rank; the rest (batch
    normalisation's moving statistics, none in LeNet, the MLP and the video model) must be
    floating point for `Exchange.average_variables` to take them.
    """
    spec = dataset_spec("moving-mnist" if model_name == "video" else "cifar-synthetic")
    model = build_model(
        model_name, input_shape=spec.input_shape, num_classes=spec.num_classes, resnet_depth=8
    )
    assert len(model.variables) == len(model.trainable_variables) + len(
        model.non_trainable_variables
    )
    assert all(variable.dtype.is_floating for variable in model.non_trainable_variables)
    assert bool(model.non_trainable_variables) == (model_name == "resnet")
