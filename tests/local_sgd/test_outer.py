"""Outer optimizers: the DiLoCo update rules, configs that round-trip, errors naming values."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from globaldl.local_sgd import outer
from globaldl.local_sgd.outer import OuterNesterov, OuterSGD


def _run(optimizer: outer.OuterOptimizer, pseudo_gradients: list[float]) -> np.ndarray:
    weights = tf.Variable([1.0, -2.0])
    optimizer.build([weights])
    for value in pseudo_gradients:
        optimizer.apply([tf.constant([value, 2 * value])], [weights])
    return weights.numpy()


def _reference(pseudo_gradients: list[float], lr: float, momentum: float, nesterov: bool):
    weights, velocity = np.array([1.0, -2.0]), np.zeros(2)
    for value in pseudo_gradients:
        gradient = np.array([value, 2 * value])
        velocity = momentum * velocity + gradient
        weights -= lr * (gradient + momentum * velocity if nesterov else velocity)
    return weights


def test_sgd_at_learning_rate_one_without_momentum_averages_the_models() -> None:
    # The weights move by exactly the averaged delta: the mean of the devices' models.
    np.testing.assert_allclose(_run(OuterSGD(), [0.25]), [0.75, -2.5])


@pytest.mark.parametrize(("nesterov", "momentum"), [(False, 0.5), (True, 0.9)])
def test_momentum_follows_the_pytorch_rule_diloco_uses(nesterov: bool, momentum: float) -> None:
    deltas = [0.3, -0.1, 0.2]
    kind = OuterNesterov if nesterov else OuterSGD
    np.testing.assert_allclose(
        _run(kind(0.7, momentum), deltas),
        _reference(deltas, 0.7, momentum, nesterov),
        rtol=1e-6,
    )


def test_configs_round_trip_and_names_resolve() -> None:
    for optimizer in (OuterSGD(1.0, 0.0), OuterNesterov(0.7, 0.9)):
        again = outer.get(outer.serialize(optimizer))
        assert type(again) is type(optimizer) and again.get_config() == optimizer.get_config()
    assert isinstance(outer.get("nesterov"), OuterNesterov)
    assert outer.get("nesterov").get_config() == {"learning_rate": 0.7, "momentum": 0.9}


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: outer.get("adamw"), "unknown outer optimizer 'adamw'; valid names"),
        (lambda: OuterSGD(learning_rate=0.0), "learning_rate=0.0 must be a positive number"),
        (lambda: OuterNesterov(momentum=1.0), r"momentum=1.0 is out of range; allowed: \[0, 1\)"),
        (lambda: outer.get(3), "cannot interpret 3 as an outer optimizer"),
    ],
)
def test_bad_outer_optimizers_are_named(build, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build()
