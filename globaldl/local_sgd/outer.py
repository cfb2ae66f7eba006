"""Outer optimizers: apply the fleet's averaged round delta (the pseudo-gradient) to the weights.

In a round, every device takes local steps from the global weights; its pseudo-gradient is
the global weights minus its weights now, which points the way a gradient does (downhill is
minus it). The devices average their pseudo-gradients, and an outer optimizer steps the global
weights with that average. `sgd` with learning rate 1 and no momentum is plain model averaging
(local SGD); DiLoCo uses Nesterov momentum (learning rate 0.7, momentum 0.9 in its paper).

Both follow the convention of PyTorch's SGD, which DiLoCo's reference code uses::

    velocity = momentum * velocity + pseudo_gradient
    sgd:      weights -= learning_rate * velocity
    nesterov: weights -= learning_rate * (pseudo_gradient + momentum * velocity)
"""

from __future__ import annotations

from typing import Any, ClassVar

import tensorflow as tf

from globaldl.local_sgd.schedule import DEFAULT_OUTER_MOMENTUM, DILOCO_OUTER_LR


class OuterOptimizer:
    """Steps the global weights with the averaged pseudo-gradient, once per round.

    A subclass sets `name` (its registry name) and overrides `_step(pseudo_gradient,
    velocity)`, returning what is subtracted from the weights; `velocity` is the tensor after
    this round's momentum update (the pseudo-gradient itself when momentum is 0). `build`
    creates the velocity slots; `apply` is pure TensorFlow, to be traced inside a
    `tf.function`. Arguments are checked at once, with messages naming them, and `get_config`
    round-trips through `from_config`.

    Example:
        >>> class Plain(OuterOptimizer):
        ...     name = "plain"
        ...     def _step(self, pseudo_gradient, velocity):
        ...         return self.learning_rate * pseudo_gradient

    """

    name: ClassVar[str] = ""

    def __init__(self, learning_rate: float = 1.0, momentum: float = 0.0) -> None:
        if isinstance(learning_rate, bool) or not isinstance(learning_rate, int | float):
            raise ValueError(f"learning_rate={learning_rate!r} must be a number")
        if not 0 < learning_rate < float("inf"):
            raise ValueError(f"learning_rate={learning_rate!r} must be a positive number")
        if isinstance(momentum, bool) or not isinstance(momentum, int | float):
            raise ValueError(f"momentum={momentum!r} must be a number")
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"momentum={momentum!r} is out of range; allowed: [0, 1)")
        self.learning_rate = float(learning_rate)
        self.momentum = float(momentum)
        self.velocities: list[tf.Variable] = []

    def build(self, variables: list[tf.Variable]) -> None:
        """Create one velocity slot per variable (none when momentum is 0)."""
        if self.momentum == 0.0:
            return
        self.velocities = [
            tf.Variable(tf.zeros_like(variable), trainable=False, name="outer_velocity")
            for variable in variables
        ]

    @property
    def variables(self) -> list[tf.Variable]:
        """The optimizer's state: identical on every device, checkpointed with the weights."""
        return list(self.velocities)

    def apply(self, pseudo_gradients: list[tf.Tensor], variables: list[tf.Variable]) -> None:
        """Step `variables` with the averaged `pseudo_gradients` (call inside a tf.function)."""
        if self.momentum > 0.0 and len(self.velocities) != len(variables):
            raise ValueError(
                f"{type(self).__name__} was built for {len(self.velocities)} variables, "
                f"got {len(variables)}; call build(variables) first"
            )
        for index, (pseudo_gradient, variable) in enumerate(
            zip(pseudo_gradients, variables, strict=True)
        ):
            velocity = pseudo_gradient
            if self.momentum > 0.0:
                slot = self.velocities[index]
                velocity = slot.assign(self.momentum * slot + pseudo_gradient)
            variable.assign_sub(self._step(pseudo_gradient, velocity))

    def _step(self, pseudo_gradient: tf.Tensor, velocity: tf.Tensor) -> tf.Tensor:
        raise NotImplementedError

    def get_config(self) -> dict[str, Any]:
        """The keyword arguments that rebuild this optimizer."""
        return {"learning_rate": self.learning_rate, "momentum": self.momentum}

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> OuterOptimizer:
        """Rebuild an optimizer from `get_config`'s output."""
        return cls(**config)

    def __repr__(self) -> str:
        arguments = ", ".join(f"{key}={value!r}" for key, value in self.get_config().items())
        return f"{type(self).__name__}({arguments})"


class OuterSGD(OuterOptimizer):
    """SGD with heavy-ball momentum; learning rate 1 and momentum 0 average the models."""

    name = "sgd"

    def _step(self, pseudo_gradient: tf.Tensor, velocity: tf.Tensor) -> tf.Tensor:
        return self.learning_rate * velocity


class OuterNesterov(OuterOptimizer):
    """SGD with Nesterov momentum, DiLoCo's outer optimizer."""

    name = "nesterov"

    def __init__(
        self,
        learning_rate: float = DILOCO_OUTER_LR,
        momentum: float = DEFAULT_OUTER_MOMENTUM["nesterov"],
    ) -> None:
        super().__init__(learning_rate, momentum)

    def _step(self, pseudo_gradient: tf.Tensor, velocity: tf.Tensor) -> tf.Tensor:
        return self.learning_rate * (pseudo_gradient + self.momentum * velocity)


OUTER_OPTIMIZERS: dict[str, type[OuterOptimizer]] = {
    cls.name: cls for cls in (OuterSGD, OuterNesterov)
}


def get(identifier: str | dict[str, Any] | OuterOptimizer) -> OuterOptimizer:
    """An outer optimizer from a name, a `{"class_name": ..., "config": {...}}` dict or itself.

    Raises ValueError naming the identifier and the valid names.
    """
    if isinstance(identifier, OuterOptimizer):
        return identifier
    if isinstance(identifier, str):
        return _lookup(identifier)()
    if isinstance(identifier, dict) and "class_name" in identifier:
        return _lookup(identifier["class_name"]).from_config(dict(identifier.get("config", {})))
    raise ValueError(
        f"cannot interpret {identifier!r} as an outer optimizer: pass one of "
        f"{sorted(OUTER_OPTIMIZERS)}, a config dict or an OuterOptimizer"
    )


def serialize(optimizer: OuterOptimizer) -> dict[str, Any]:
    """The config dict `get` accepts."""
    return {"class_name": optimizer.name, "config": optimizer.get_config()}


def _lookup(name: str) -> type[OuterOptimizer]:
    try:
        return OUTER_OPTIMIZERS[name]
    except KeyError:
        raise ValueError(
            f"unknown outer optimizer {name!r}; valid names: {sorted(OUTER_OPTIMIZERS)}"
        ) from None
