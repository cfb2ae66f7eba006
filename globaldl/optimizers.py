"""The inner optimizer: built from the settings, and its variables in a stable order.

The trainer builds it; the round engine and the elastic state also carry its variables (a
round's local steps move them, a committed state keeps them), without importing the trainer.
"""

from __future__ import annotations

import tensorflow as tf
import tf_keras as keras

from globaldl import schedules
from globaldl.compression import GradientCompressor
from globaldl.settings import TrainSettings


def make_optimizer(
    settings: TrainSettings,
    learning_rate: float | schedules.WarmupThenDecay,
    compressor: GradientCompressor,
) -> keras.optimizers.Optimizer:
    """`--optimizer`'s optimizer (sgd with momentum, or adam) at `learning_rate`."""
    if settings.optimizer == "adam":
        return keras.optimizers.Adam(learning_rate=learning_rate)
    # DGC's momentum correction accumulates momentum inside the compressor, before
    # sparsification; the optimizer then must not apply momentum a second time.
    momentum = 0.0 if compressor.applies_momentum else settings.momentum
    return keras.optimizers.SGD(learning_rate=learning_rate, momentum=momentum)


def optimizer_variables(optimizer: keras.optimizers.Optimizer) -> list[tf.Variable]:
    """The optimizer's own variables (iteration count, slots), in a stable order."""
    variables = optimizer.variables
    return list(variables() if callable(variables) else variables)
