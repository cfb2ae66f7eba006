"""What a compressor keeps between steps: its own state, the shared state, and a step's update."""

from __future__ import annotations

from typing import NamedTuple

import tensorflow as tf

LOCAL_STATE = ("residual", "momentum")
"""State each rank keeps for itself; the rest (scales, scores, bases, weight masks) is shared:
identical on every rank, because every rank derives it from the same exchanged sums."""


class StateUpdate(NamedTuple):
    """New values for ``GradientCompressor.step_state_variables``, in that order, and a carry.

    ``carry`` holds what a later call of the same step needs (the positions a summed payload
    used, PowerSGD's factors between its rounds). A NamedTuple of tensors, so it can be
    returned from (or passed into) a ``tf.function``.
    """

    values: tuple[tf.Tensor, ...]
    carry: tuple[tf.Tensor, ...] = ()


class CompressorState:
    """Named state variables, split into local and shared, and StateUpdates built from them.

    Args:
        variables: name -> variable, in the order a StateUpdate carries them (names in
            LOCAL_STATE are this rank's own, the others shared).
        masks: the weight-pruning masks (shared; updated by the schedule, not by a step).

    """

    def __init__(self, variables: dict[str, tf.Variable], masks: list[tf.Variable]) -> None:
        self.variables = dict(variables)
        self.step_variables = list(self.variables.values())
        self.local = [v for name, v in self.variables.items() if name in LOCAL_STATE]
        self.shared = [v for name, v in self.variables.items() if name not in LOCAL_STATE]
        self.shared += masks
        self.everything = self.local + self.shared

    def __contains__(self, name: object) -> bool:
        return name in self.variables

    def read(self) -> dict[str, tf.Tensor]:
        """Every step variable's current value, by name."""
        return {name: tf.convert_to_tensor(v) for name, v in self.variables.items()}

    def update(self, values: dict[str, tf.Tensor], carry: tuple[tf.Tensor, ...]) -> StateUpdate:
        """A StateUpdate of ``values`` (by name, one per step variable)."""
        return StateUpdate(tuple(values[name] for name in self.variables), carry)

    def named(self, update: StateUpdate) -> dict[str, tf.Tensor]:
        """The values of ``update`` by name."""
        return dict(zip(self.variables, update.values, strict=True))

    def replace(self, update: StateUpdate, **values: tf.Tensor) -> StateUpdate:
        """``update`` with some values replaced (by name), its carry kept."""
        return self.update({**self.named(update), **values}, update.carry)

    def apply(self, update: StateUpdate) -> None:
        """Assign the values of ``update`` to the step variables."""
        if len(update.values) != len(self.step_variables):
            raise ValueError(
                f"StateUpdate has {len(update.values)} values for "
                f"{len(self.step_variables)} state variables"
            )
        for variable, value in zip(self.step_variables, update.values, strict=True):
            variable.assign(value)
