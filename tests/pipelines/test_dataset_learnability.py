"""The datasets are learnable through the pipelines: a short keras fit beats chance clearly.

Thresholds sit well below what was measured (see the report of this module's author):
they catch a broken pipeline (labels detached from images, wrong scaling, a dataset made
unlearnable), not small changes in accuracy.
"""

from __future__ import annotations

import tf_keras as keras

from globaldl.models import build_model
from globaldl.pipelines import InputPipeline, make_pipeline


def _fit_and_validate(model: keras.Model, pipeline: InputPipeline, epochs: int) -> float:
    """Train ``epochs`` epochs on the pipeline's batches; return validation accuracy."""
    model.compile(
        optimizer=keras.optimizers.Adam(1e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    for epoch in range(epochs):
        model.fit(pipeline.train_batches(epoch), epochs=1, verbose=0)
    _, accuracy = model.evaluate(pipeline.validation_batches(), verbose=0)
    return float(accuracy)


def _linear_model(pipeline: InputPipeline) -> keras.Model:
    return keras.Sequential(
        [
            keras.Input(pipeline.spec.input_shape),
            keras.layers.Flatten(),
            keras.layers.Dense(
                pipeline.spec.num_classes,
                kernel_initializer=keras.initializers.GlorotUniform(seed=0),
            ),
        ],
        name="linear",
    )


def test_lenet_on_mnist_beats_chance_clearly_after_two_epochs(record_property) -> None:
    pipeline = make_pipeline("mnist", rank=0, num_ranks=1, batch_size=32, seed=0)
    model = build_model("lenet", input_shape=pipeline.spec.input_shape, num_classes=10, seed=0)
    accuracy = _fit_and_validate(model, pipeline, epochs=2)
    record_property("lenet_mnist_validation_accuracy", accuracy)
    print(f"lenet on mnist, 2 epochs: validation accuracy {accuracy:.3f}")
    assert accuracy >= 0.80  # chance is 0.10


def test_cnn_beats_chance_and_a_linear_model_clearly_on_cifar_synthetic(record_property) -> None:
    pipeline = make_pipeline("cifar-synthetic", rank=0, num_ranks=1, batch_size=64, seed=0)
    lenet = build_model("lenet", input_shape=pipeline.spec.input_shape, num_classes=10, seed=0)
    cnn_accuracy = _fit_and_validate(lenet, pipeline, epochs=5)
    linear_accuracy = _fit_and_validate(_linear_model(pipeline), pipeline, epochs=5)
    record_property("lenet_cifar_synthetic_validation_accuracy", cnn_accuracy)
    record_property("linear_cifar_synthetic_validation_accuracy", linear_accuracy)
    print(f"cifar-synthetic, 5 epochs: lenet {cnn_accuracy:.3f}, linear {linear_accuracy:.3f}")
    assert cnn_accuracy >= 0.40  # chance is 0.10
    assert linear_accuracy <= 0.25
    assert cnn_accuracy - linear_accuracy >= 0.20
